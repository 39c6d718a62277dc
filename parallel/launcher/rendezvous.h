// Rendezvous: how a node's loomrun learns its place in the job, before each attempt
// (torchrun's --rdzv-backend).
//
//   Rendezvous meeting(options);
//   int attempt = meeting.first_attempt();     // 0, or the attempt of a job already running
//   Placement at = meeting.join(attempt);      // node rank, and where the workers' store is
//
// static (the default, torchrun's too): every node is given --node_rank; the workers'
//   store is at --master_addr:--master_port (or --rdzv_endpoint HOST:PORT, which names
//   the same thing). join() returns them.
// c10d: no --node_rank. The loomrun on the host --rdzv_endpoint names serves a small
//   store there (port 29400 by default), and every node's loomrun, that one included,
//   meets there once per attempt: node ranks go by order of arrival, and node rank 0
//   picks the workers' store (its own address as the others reach it, a free port).
//   torchrun's command lines run unchanged:
//     loomrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d
//             --rdzv_endpoint node01:29400 --rdzv_id job7 ./train      (one line, on every node)
//
// Note [A node that comes back]
// With --max-restarts, a node that loses its workers restarts them itself (supervisor.h).
// A node lost whole -- its loomrun killed, the host rebooted -- comes back as a fresh
// loomrun at attempt 0, while the others have moved on to attempt 1 and refuse ranks of
// an older one (Note [Restart generations], launch_env.h). So a fresh loomrun first asks
// where the job is: under c10d, the meeting point keeps the latest attempt; under static
// with --max-restarts (without, every attempt is the first), a node other than node 0
// asks the workers' store, whose rank 0 records its attempt (kRestartCountKey), waiting
// at most 2 s for an answer (a job that is just starting has no store yet: attempt 0).
// It then starts at that attempt, and the job goes on from its last checkpoint with
// every node. The node that serves the store (static: node 0;
// c10d: the endpoint's) cannot come back this way: its loss takes the meeting point with
// it, and the others fail.
#pragma once

#include <memory>
#include <string>

#include "parallel/launcher/options.h"

namespace loom::distributed {
class TCPStore;
}

namespace loom::launcher {

struct Placement {
  int node_rank = 0;
  std::string master_addr;  // the workers' MASTER_ADDR and MASTER_PORT
  int master_port = 0;
};

class Rendezvous {
 public:
  // c10d: serves or connects to the meeting point (waiting up to the join timeout for it).
  explicit Rendezvous(const LaunchOptions& options);
  ~Rendezvous();

  // The attempt a fresh loomrun starts at; see Note [A node that comes back].
  int first_attempt();
  // This node's place for `attempt`. c10d: waits for node rank 0 of that attempt to say
  // where the store is; a loom::Error when more than --nnodes nodes arrive.
  Placement join(int attempt);

 private:
  const LaunchOptions& o_;
  std::string host_;  // c10d: the endpoint
  int port_ = 0;
  std::unique_ptr<distributed::TCPStore> meeting_;  // c10d
};

}  // namespace loom::launcher
