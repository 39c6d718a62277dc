// all_reduce latency of the gloo backend's two transports, shared memory and TCP, on 2
// ranks (threads of this process, each with its own communicator, as the tests run them).
//
//   build/bench/bench_comm                      # 1, 8 and 25 MiB float32, 15 repeats each
//
// The sizes are ResNet18's DDP buckets (25 MiB, ~8 MiB) and a small one. The number is
// the median time from issuing all_reduce to wait() returning, after a barrier so that
// both ranks start together. It measures the transport alone: in DDP, the same copies
// also compete with the training threads for the cores (see docs/ddp.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/factory.h"
#ifdef LOOM_WITH_GLOO
#include "parallel/comm/gloo_communicator.h"
#endif

using namespace loom;

int main() {
#ifndef LOOM_WITH_GLOO
  std::printf("bench_comm: this loom was built without Gloo\n");
  return 0;
#else
  using namespace loom::distributed;
  constexpr int kRepeats = 15;
  const std::vector<int64_t> mib = {1, 8, 25};
  std::printf("%-10s %10s %14s %12s\n", "transport", "MiB", "median ms", "GB/s");
  for (bool shared_memory : {true, false}) {
    auto server = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
    std::vector<std::string> lines(mib.size());
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto store = r == 0 ? server
                            : std::make_shared<TCPStore>("127.0.0.1", server->port(), false, std::chrono::seconds(30));
        GlooOptions options;
        options.shared_memory = shared_memory;
        GlooCommunicator comm(store, "bench", r, 2, options);
        for (size_t k = 0; k < mib.size(); ++k) {
          Tensor t = full({mib[k] << 18}, 1.0);  // 2^18 float32 = 1 MiB
          std::vector<double> ms;
          for (int i = 0; i < kRepeats; ++i) {
            comm.barrier()->wait();
            const auto start = std::chrono::steady_clock::now();
            comm.all_reduce(t)->wait();
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
          }
          std::sort(ms.begin(), ms.end());
          const double median = ms[ms.size() / 2];
          char line[128];
          std::snprintf(line, sizeof(line), "%-10s %10lld %14.2f %12.2f", comm.collective_transport(),
                        static_cast<long long>(mib[k]), median, double(mib[k] << 20) / (median * 1e6));
          if (r == 0) lines[k] = line;
        }
      });
    }
    for (auto& t : ranks) t.join();
    for (const auto& line : lines) std::printf("%s\n", line.c_str());
  }
  return 0;
#endif
}
