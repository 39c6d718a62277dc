// train_cifar10 --mode ddp started the way Slurm's srun and Open MPI's mpirun start it:
// a plain shell loop sets only the scheduler's variables (no RANK, WORLD_SIZE,
// MASTER_ADDR...), and init_process_group works out who is who
// (parallel/comm/launch_env.h). The contract: such a job trains exactly like the same
// number of workers under loomrun (bitwise-identical weights).
// meson passes the launcher's and the trainer's paths in LOOMRUN and TRAIN_CIFAR10.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "core/error.h"
#include "parallel/store/socket.h"  // defines: net::listen_on, net::find_free_port
#include "process_launch.h"         // defines: Launch, Result, TempDir, path_from_env, contains

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::testing;

namespace {

const std::string kTrainArgs =
    " --mode ddp --model tiny --synthetic --max-steps 2 --batch-size 8 --eval-limit 16 --threads 1 --workers 0 --quiet";

// Variables a launcher or the test runner might have left behind; the loop must see none.
const std::string kClean = "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT "
                           "-u LOOM_RESTART_COUNT -u TORCHELASTIC_RESTART_COUNT ";

// Starts n copies of the trainer from a shell loop, each with `vars` (which may use $i,
// the task index), and fails unless all of them exit 0.
Result run_loop(int n, const std::string& vars, const fs::path& weights) {
  std::string script = "pids=; for i in $(seq 0 " + std::to_string(n - 1) + "); do " + kClean + vars + " " +
                       path_from_env("TRAIN_CIFAR10") + kTrainArgs + " --save " + weights.string() +
                       " & pids=\"$pids $!\"; done; rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc";
  return Launch("sh -c '" + script + "'").finish();
}

// A Slurm job id whose derived port (15000 + its last four digits) is free right now.
std::string job_id_with_free_port() {
  std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 100; ++attempt) {
    int last4 = static_cast<int>(random() % 10000);
    try {
      distributed::net::listen_on(15000 + last4);  // closes again at once
      return "77" + std::to_string(10000 + last4).substr(1);
    } catch (const Error&) {
    }
  }
  FAIL("no free port in 15000..24999");
  return "";
}

std::string loomrun_weights(int n, const fs::path& dir) {
  fs::path weights = dir / ("loomrun" + std::to_string(n) + ".safetensors");
  Result r = Launch(kClean + path_from_env("LOOMRUN") + " --standalone --nproc_per_node " + std::to_string(n) + " " +
                    path_from_env("TRAIN_CIFAR10") + kTrainArgs + " --save " + weights.string())
                 .finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  std::string bytes = read_file(weights);
  REQUIRE(bytes.size() > 10000);
  return bytes;
}

}  // namespace

TEST_CASE("2 and 3 processes with only Slurm's variables, or only Open MPI's, train like loomrun's workers") {
  TempDir dir("loom_scheduler_launch");
  for (int n : {2, 3}) {
    CAPTURE(n);
    const std::string reference = loomrun_weights(n, dir.path);
    const std::string count = std::to_string(n);

    // srun --ntasks n on one node. The host list is compressed (its first host is
    // 127.0.0.1) and the port comes from the job id, as on a cluster.
    fs::path slurm = dir.path / ("slurm" + count + ".safetensors");
    Result s = run_loop(n, "SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 SLURM_NTASKS=" + count +
                               " SLURM_TASKS_PER_NODE=" + count + " SLURM_JOB_NODELIST=127.0.0.[1-4],other" +
                               " SLURM_JOB_ID=" + job_id_with_free_port(), slurm);
    REQUIRE_MESSAGE(s.code == 0, s.output);
    CHECK_MESSAGE(contains(s.output, "rank 0 of " + count + " from Slurm"), s.output);
    CHECK_MESSAGE(contains(s.output, "MASTER_ADDR=127.0.0.1 "), s.output);
    CHECK(s.output.find("from Slurm") == s.output.rfind("from Slurm"));  // rank 0 says it, once
    CHECK(read_file(slurm) == reference);  // bitwise

    // mpirun -np n -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=...
    fs::path mpi = dir.path / ("mpi" + count + ".safetensors");
    Result m = run_loop(n, "OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_LOCAL_RANK=$i OMPI_COMM_WORLD_SIZE=" + count +
                               " OMPI_COMM_WORLD_LOCAL_SIZE=" + count + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                               std::to_string(distributed::net::find_free_port()), mpi);
    REQUIRE_MESSAGE(m.code == 0, m.output);
    CHECK_MESSAGE(contains(m.output, "rank 0 of " + count + " from Open MPI"), m.output);
    CHECK(read_file(mpi) == reference);
  }
}

TEST_CASE("Open MPI without MASTER_ADDR, and Slurm and Open MPI disagreeing: clear errors, no hang") {
  TempDir dir("loom_scheduler_launch");
  Result no_addr = run_loop(1, "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1", dir.path / "w.safetensors");
  CHECK(no_addr.code != 0);
  CHECK_MESSAGE(contains(no_addr.output, "MASTER_ADDR"), no_addr.output);
  CHECK_MESSAGE(contains(no_addr.output, "mpirun (pass -x MASTER_ADDR"), no_addr.output);

  Result conflict = run_loop(1, "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 SLURM_PROCID=0 SLURM_NTASKS=2 "
                                "MASTER_ADDR=127.0.0.1",
                             dir.path / "w.safetensors");
  CHECK(conflict.code != 0);
  CHECK_MESSAGE(contains(conflict.output, "conflicting launchers"), conflict.output);
  CHECK(conflict.seconds < 30);
}
