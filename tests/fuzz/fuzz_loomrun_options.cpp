// libFuzzer: loomrun's command line (parallel/launcher/options.h). The input is split at
// NUL bytes into arguments after "loomrun". Bad flags must be a loom::Error naming them;
// accepted ones must satisfy the options' invariants. Run by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/launcher/options.h"  // defines: parse_launch_options

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace loom;
  std::vector<std::string> args = {"loomrun"};
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(current);
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    launcher::LaunchOptions o = launcher::parse_launch_options(static_cast<int>(argv.size()), argv.data());
    if (o.help) return 0;
    if (o.command.empty() || o.nproc_per_node < 1 || o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes ||
        o.master_port < 1 || o.master_port > 65535 || o.max_restarts < 0 || o.grace_period_s < 0 ||
        o.prefix_streams < 0 || o.prefix_streams > 3)
      std::abort();
  } catch (const Error&) {
  }
  return 0;
}
