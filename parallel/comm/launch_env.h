// Who am I in the job? init_process_group("gloo", "env://") reads it from whichever
// launcher started the process: loomrun / torchrun, Slurm's srun, or Open MPI's mpirun.
//
//   srun --ntasks-per-node 4 ./train --mode ddp      # no RANK: SLURM_PROCID, SLURM_NTASKS, ...
//   mpirun -np 8 -x MASTER_ADDR=node01 ./train       # no RANK: OMPI_COMM_WORLD_RANK, ...
//   LaunchEnv env = read_launch_env(process_environment());   // {rank, world_size, ..., source}
//
// Note [Where rank and world size come from]
// Like PyTorch Lightning and DeepSpeed, loom looks at the sources in a fixed order and
// uses the first that is there:
//   1. "env"      RANK and WORLD_SIZE (loomrun, torchrun, or set by hand). A launcher
//                 started inside a Slurm allocation (srun loomrun ...) wins over Slurm,
//                 whose variables then describe loomrun's tasks, not the workers.
//   2. "openmpi"  OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE. mpirun under
//                 Slurm inherits the allocation's SLURM_* variables; mpirun's are the
//                 ones that describe this process.
//   3. "slurm"    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the tasks on this node
//                 from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE ("2(x3),1").
// MASTER_ADDR and MASTER_PORT from the environment always win. Otherwise Slurm gives the
// first host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) and a port derived from
// SLURM_JOB_ID, 15000 + its last four digits (Lightning's rule, so every task computes
// the same one without talking); Open MPI needs MASTER_ADDR (mpirun -x MASTER_ADDR=...;
// init_process_group says so when it is missing) and defaults MASTER_PORT to 29500.
// Half a source is an error, not a fallback: RANK without WORLD_SIZE, SLURM_PROCID
// without SLURM_NTASKS. So is a job that both Open MPI and Slurm describe with different
// numbers of processes: which one is right cannot be guessed, and a guess would hang.
//
// Note [Restart generations]
// loomrun --max-restarts starts every worker again after a failure, with the attempt in
// LOOM_RESTART_COUNT. On several nodes, a worker of the old attempt may still be alive
// (its node's loomrun has not noticed yet) when the new rank 0 serves the store on the
// same port; if it joined, it would take a new rank's place. So the store records its
// attempt: rank 0 sets "launch/restart_count"; every other rank reads it first, before
// touching any other key. A rank of an older attempt is refused with an error; a rank of
// a newer attempt has reached the old rank 0's store, so it disconnects and retries
// until the new one is up (or the timeout passes).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/store/tcp_store.h"  // defines: TCPStore

namespace loom::distributed {

using Environment = std::map<std::string, std::string>;

struct LaunchEnv {
  std::string source;           // "env", "openmpi", "slurm", or "" (none: rank and world_size -1)
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;          // -1: not known
  int local_world_size = -1;    // -1: not known
  std::string master_addr;      // "" when no source gave one
  int master_port = 0;          // 0 when no source gave one
  std::string master_from;      // where master_addr/port came from, for the log line
  int restart_count = 0;        // LOOM_RESTART_COUNT (or TORCHELASTIC_RESTART_COUNT); 0 outside loomrun

  // One line for rank 0's log: "Slurm (SLURM_PROCID=0, SLURM_NTASKS=4); MASTER_ADDR=..."
  std::string describe() const;
};

// The process's environment (environ) as a map.
Environment process_environment();

// Reads rank, world size, local rank and the store's address; see Note [Where rank and
// world size come from]. Throws loom::Error on half a source, conflicting sources or
// malformed values; a missing source is source == "", not an error.
LaunchEnv read_launch_env(const Environment& env);

// Slurm's compressed host lists: "node[01-04,07],gpu3" -> node01 ... node04, node07, gpu3.
// Zero padding is kept; several bracket groups in one name multiply out. Returns the
// first `max_hosts` (a huge range is not expanded past them). Throws loom::Error on
// unbalanced or nested brackets, empty names and malformed or backward ranges.
std::vector<std::string> expand_hostlist(const std::string& list, size_t max_hosts = 1 << 20);

// Slurm's tasks-per-node form: "2(x3),1" -> {2, 2, 2, 1}; "4" -> {4}.
std::vector<int> expand_tasks_per_node(const std::string& spec);

// Lightning's port for a Slurm job: 15000 + the job id's last four digits.
int port_from_slurm_job_id(const std::string& job_id);

// The local rank as the launcher gave it (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or
// SLURM_LOCALID), or `fallback`: for choosing cuda:LOCAL_RANK before the group exists.
int launch_local_rank(int fallback = 0);

// The store's key under which rank 0 records its attempt (loomrun reads it too, to join a
// job that restarted without it: Note [A node that comes back], parallel/launcher/rendezvous.h).
constexpr const char* kRestartCountKey = "launch/restart_count";

// The store of this attempt: rank 0 serves it and records `restart_count` in it; other
// ranks connect and compare. See Note [Restart generations].
std::shared_ptr<TCPStore> connect_store_of_attempt(const std::string& host, int port, int rank, int restart_count,
                                                   std::chrono::milliseconds timeout);

}  // namespace loom::distributed
