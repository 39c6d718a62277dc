// loomrun's command line: torchrun's options, parsed into LaunchOptions.
//
//   loomrun --nproc_per_node 2 ./train --epochs 3
//   loomrun --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 --nproc_per_node 4 ./train   (on node 0)
//   loomrun --nnodes 2 --node_rank 1 --master_addr 10.0.0.1 --nproc_per_node 4 ./train   (on node 1)
//
// As in torchrun, options may be spelled with '_' or '-' (--nproc-per-node) and take
// their value as the next argument or after '='. The first argument that is not an
// option is the program; everything after it belongs to the program.
#pragma once

#include <string>
#include <vector>

namespace loom::launcher {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;  // one node, a free port picked for the store
  // torchrun's rendezvous (rendezvous.h): "static" (default: --node_rank given, the store
  // at master_addr:master_port, which --rdzv_endpoint HOST:PORT may name instead) or
  // "c10d" (node ranks by arrival at --rdzv_endpoint, whose node serves the meeting).
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;  // "HOST[:PORT]"; "" = master_addr:master_port
  std::string rdzv_id = "none";
  double rdzv_join_timeout_s = 600;  // --rdzv_conf join_timeout=S (torchrun's default)
  bool node_rank_given = false;
  // Which streams get each line prefixed with "[rank N]: " (bit 1: stdout, bit 2:
  // stderr), as torchrun's --tee. 0: workers write straight to loomrun's streams.
  int prefix_streams = 0;
  // torchrun's --max-restarts: how many times a failed group is started again
  // (Note [How loomrun restarts a job] in supervisor.h).
  int max_restarts = 0;
  double grace_period_s = 5.0;  // after SIGTERM, how long workers get before SIGKILL
  // torchrun's --numa-binding: "" (none, the default) or "exclusive" (cpu_binding.h).
  std::string numa_binding;
  bool help = false;
  std::vector<std::string> command;  // the program and its arguments

  int world_size() const { return nnodes * nproc_per_node; }
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
};

// Throws loom::Error naming the bad option and what was expected.
LaunchOptions parse_launch_options(int argc, const char* const* argv);

const char* launch_usage();

}  // namespace loom::launcher
