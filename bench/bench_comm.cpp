// all_reduce and all_gather latency of the gloo backend's transports on 2 ranks (threads
// of this process, each with its own communicator, as the tests run them): shared memory
// with an ordinary tensor (staged through the segment), shared memory with a tensor from
// zeros_symmetric (reduced in place, Note [Symmetric memory]: how DDP's buckets go; for
// all_gather, read where it lies, Note [Symmetric all_gather]: how FSDP's shards go), and TCP.
//
//   build/bench/bench_comm                      # 1, 8 and 25 MiB float32, 15 repeats each
//
// The sizes are ResNet18's DDP buckets (25 MiB, ~8 MiB) and a small one; for all_gather
// they are the gathered output (each rank's input is half of it: ResNet18's largest FSDP
// unit is 18 MiB). "median ms" is the median time from issuing the collective to wait()
// returning, after a barrier so that both ranks start together; "CPU ms" is the CPU time
// of the whole process (both ranks, their communicator threads, Gloo's I/O threads) per
// collective, barriers included. In DDP and FSDP the same CPU is taken from the training
// threads when every core trains (docs/ddp.md, docs/fsdp.md).
#include <time.h>

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
  auto process_cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
  };
  std::printf("%-10s %-15s %6s %10s %8s %8s\n", "collective", "transport", "MiB", "median ms", "GB/s", "CPU ms");
  struct Config {
    bool shared_memory, symmetric;
  };
  for (const std::string op : {"all_reduce", "all_gather"})
  for (Config config : {Config{true, false}, Config{true, true}, Config{false, false}}) {
    auto server = std::make_shared<TCPStore>("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
    std::vector<std::string> lines(mib.size());
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto store = r == 0 ? server
                            : std::make_shared<TCPStore>("127.0.0.1", server->port(), false, std::chrono::seconds(30));
        GlooOptions options;
        options.shared_memory = config.shared_memory;
        GlooCommunicator comm(store, "bench", r, 2, options);
        for (size_t k = 0; k < mib.size(); ++k) {
          const Shape shape = {op == "all_reduce" ? mib[k] << 18 : mib[k] << 17};  // 2^18 float32 = 1 MiB
          Tensor t = config.symmetric ? comm.zeros_symmetric(shape, TensorOptions(kFloat32)) : zeros(shape);
          t.fill_(1.0);
          Tensor gathered = zeros({mib[k] << 18});
          std::vector<Tensor> pieces = gathered.chunk(2);
          std::vector<double> ms;
          comm.barrier()->wait();
          const double cpu_start = process_cpu_ms();
          for (int i = 0; i < kRepeats; ++i) {
            comm.barrier()->wait();
            const auto start = std::chrono::steady_clock::now();
            if (op == "all_reduce") comm.all_reduce(t)->wait();
            else comm.all_gather(pieces, t)->wait();
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
          }
          comm.barrier()->wait();
          const double cpu = (process_cpu_ms() - cpu_start) / kRepeats;  // both ranks: the same window
          std::sort(ms.begin(), ms.end());
          const double median = ms[ms.size() / 2];
          const std::string name = std::string(comm.collective_transport()) +
                                   (config.symmetric && comm.why_not_symmetric().empty() ? " symmetric" : "");
          char line[160];
          std::snprintf(line, sizeof(line), "%-10s %-15s %6lld %10.2f %8.2f %8.2f", op.c_str(), name.c_str(),
                        static_cast<long long>(mib[k]), median, double(mib[k] << 20) / (median * 1e6), cpu);
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
