// loomrun: real launches of a tiny worker program (loomrun_worker.cpp). meson passes
// the two executables' paths in LOOMRUN and LOOMRUN_WORKER.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/launcher/cpu_binding.h"
#include "parallel/store/socket.h"
#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains

extern char** environ;

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using namespace loom::testing;

static Result run(const std::string& args) { return Launch(path_from_env("LOOMRUN") + " " + args).finish(); }

static std::string worker() { return path_from_env("LOOMRUN_WORKER"); }

// A process that exists and is not a zombie (a zombie has exited; it only awaits reaping).
static bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

// The workers write their pids into this directory (loomrun_worker's crash modes).
struct PidDir : TempDir {
  PidDir() : TempDir("loomrun_test") {}
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out;
    for (const auto& entry : fs::directory_iterator(path)) {
      pid_t pid = 0;
      std::ifstream(entry.path()) >> pid;
      if (pid > 0) out.push_back(pid);
    }
    return out;
  }
};

// Waits a little for processes to be gone: the init process reaps orphaned
// grandchildren asynchronously.
static bool all_gone(const std::vector<pid_t>& pids) {
  auto until = Clock::now() + 3s;
  while (Clock::now() < until) {
    bool any = false;
    for (pid_t p : pids) any = any || alive(p);
    if (!any) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

TEST_CASE("--help, and errors for bad options and a missing program") {
  Result help = run("--help");
  CHECK(help.code == 0);
  CHECK(contains(help.output, "--nproc_per_node"));
  Result bad = run("--nproc_per_node zero " + worker());
  CHECK(bad.code == 2);
  CHECK(contains(bad.output, "--nproc_per_node expects an integer"));
  Result node = run("--nnodes 2 --node_rank 2 " + worker());
  CHECK(contains(node.output, "--node_rank 2 is out of range"));
  Result missing = run("--nproc_per_node 2 /nonexistent/program");
  CHECK(missing.code != 0);
  CHECK(contains(missing.output, "cannot run '/nonexistent/program'"));
}

TEST_CASE("torchrun's rendezvous options: what each backend takes, and clear errors for the rest") {
  // Accepted forms run across network namespaces in test_multihost; here, the refusals.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--nnodes 1:4", "--nnodes 1:4: a loom job has a fixed number of nodes (no elastic membership"},
      {"--rdzv_backend etcd", "--rdzv_backend expects static or c10d, got 'etcd'"},
      {"--rdzv-backend c10d", "--rdzv_backend c10d needs --rdzv_endpoint HOST[:PORT]"},
      {"--rdzv-backend c10d --rdzv-endpoint h:1 --node_rank 0", "drop --node_rank"},
      {"--rdzv-backend c10d --rdzv-endpoint h:1 --master_addr h", "drop --master_addr/--master_port"},
      {"--rdzv-endpoint hostonly", "needs a port with --rdzv_backend static (HOST:PORT"},
      {"--rdzv-endpoint h:29400 --master_port 29500", "--rdzv_endpoint and --master_addr/--master_port both"},
      {"--rdzv_conf timeout=5", "loomrun knows join_timeout=SECONDS, got 'timeout=5'"},
  };
  for (const auto& item : refused) {
    const std::string& options = item.first;  // See Note [doctest messages name no structured binding]
    CAPTURE(options);
    Result r = run(options + " " + worker());
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.output, item.second), r.output);
  }
}

TEST_CASE("workers see torchrun's environment variables, and --prefix-output labels their lines") {
  Result r = run("--nproc_per_node 3 --master_port 23456 --prefix-output " + worker() + " env");
  CHECK(r.code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    std::string k = std::to_string(rank);
    CHECK_MESSAGE(contains(r.output, "[rank " + k + "]: env RANK=" + k + " LOCAL_RANK=" + k +
                                         " WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=23456"),
                  r.output);
  }
  Result second_node = run("--nnodes 2 --node_rank 1 --nproc_per_node 2 --master_addr 10.1.2.3 --tee 1 " + worker() +
                           " env");
  CHECK(contains(second_node.output, "[rank 3]: env RANK=3 LOCAL_RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 "
                                     "MASTER_ADDR=10.1.2.3 MASTER_PORT=29500"));
  Result standalone = run("--standalone " + worker() + " env");
  CHECK(contains(standalone.output, "MASTER_ADDR=127.0.0.1"));
  CHECK_FALSE(contains(standalone.output, "MASTER_PORT=29500"));
}

TEST_CASE("exclusive_cpu_sets: contiguous, disjoint, sizes within one; too few CPUs is an error naming both") {
  using loom::launcher::exclusive_cpu_sets;
  CHECK(exclusive_cpu_sets({0, 1}, 2) == std::vector<std::vector<int>>{{0}, {1}});
  CHECK(exclusive_cpu_sets({0, 1, 2, 3, 4}, 2) == std::vector<std::vector<int>>{{0, 1}, {2, 3, 4}});
  CHECK(exclusive_cpu_sets({2, 3, 8, 9}, 1) == std::vector<std::vector<int>>{{2, 3, 8, 9}});
  CHECK(loom::launcher::cpu_list_string({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8");
  try {
    exclusive_cpu_sets({0, 1}, 3);
    FAIL("expected an error");
  } catch (const loom::Error& e) {
    CHECK(contains(e.what(), "3 workers were asked for and loomrun may run on only 2 (0-1)"));
  }
}

TEST_CASE("--numa-binding exclusive: each worker runs on its own CPUs; other modes are a clear error") {
  const std::vector<int> cpus = loom::launcher::allowed_cpus();
  const int workers = std::min<int>(2, static_cast<int>(cpus.size()));
  const auto sets = loom::launcher::exclusive_cpu_sets(cpus, workers);
  Result r = run("--nproc_per_node " + std::to_string(workers) + " --numa-binding exclusive --standalone " + worker() +
                 " affinity");
  CHECK(r.code == 0);
  for (int rank = 0; rank < workers; ++rank)
    CHECK_MESSAGE(contains(r.output, "affinity RANK=" + std::to_string(rank) +
                                         " CPUS=" + loom::launcher::cpu_list_string(sets[size_t(rank)])),
                  r.output);
  Result unbound = run("--standalone " + worker() + " affinity");
  CHECK(contains(unbound.output, "CPUS=" + loom::launcher::cpu_list_string(cpus)));
  Result too_many = run("--nproc_per_node " + std::to_string(cpus.size() + 1) +
                        " --numa-binding exclusive --standalone " + worker() + " affinity");
  CHECK(too_many.code != 0);
  CHECK(contains(too_many.output, "gives each worker its own CPUs"));
  Result node = run("--numa-binding node --standalone " + worker() + " affinity");
  CHECK(node.code == 2);
  CHECK(contains(node.output, "--numa-binding 'node' is not supported"));
}

TEST_CASE("a crashing worker stops the others; loomrun names it, exits non-zero, leaves no process") {
  for (std::string mode : {"crash", "stubborn"}) {
    CAPTURE(mode);
    PidDir dir;
    Result r = run("--nproc_per_node 3 --grace_period 0.5 " + worker() + " " + mode + " " + dir.path.string());
    CHECK(r.code == 3);
    CHECK(r.seconds < 30);
    CHECK_MESSAGE(contains(r.output, "worker rank 1 (local rank 1"), r.output);
    CHECK(contains(r.output, "exited with status 3"));
    if (mode == "stubborn") CHECK(contains(r.output, "SIGKILL"));
    auto pids = dir.pids();
    CHECK(pids.size() == 6);  // 3 workers and a child each
    CHECK(all_gone(pids));
  }
}

TEST_CASE("SIGTERM to loomrun is forwarded; it exits 128+15 and leaves no process") {
  PidDir dir;
  std::vector<std::string> args = {path_from_env("LOOMRUN"), "--nproc_per_node", "2", worker(), "sleep",
                                   dir.path.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t quiet;  // loomrun's "forwarding SIGTERM" line is expected
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t loomrun = 0;
  REQUIRE(::posix_spawn(&loomrun, argv[0], &quiet, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&quiet);
  auto until = Clock::now() + 10s;
  while (dir.pids().size() < 4 && Clock::now() < until) std::this_thread::sleep_for(20ms);
  auto pids = dir.pids();
  REQUIRE(pids.size() == 4);
  REQUIRE(::kill(loomrun, SIGTERM) == 0);
  int status = 0;
  pid_t done = 0;
  until = Clock::now() + 30s;
  while ((done = ::waitpid(loomrun, &status, WNOHANG)) == 0 && Clock::now() < until) std::this_thread::sleep_for(20ms);
  REQUIRE(done == loomrun);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK(all_gone(pids));
}

TEST_CASE("two loomruns with --nnodes 2 rendezvous into one job and all-reduce across it") {
  int port = loom::distributed::net::find_free_port();
  std::string common = "--nnodes 2 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port " + std::to_string(port) +
                       " --prefix-output ";
  Launch node1(path_from_env("LOOMRUN") + " --node_rank 1 " + common + worker() + " allreduce");
  Launch node0(path_from_env("LOOMRUN") + " --node_rank 0 " + common + worker() + " allreduce");
  Result r0 = node0.finish(), r1 = node1.finish();
  CHECK_MESSAGE(r0.code == 0, r0.output);
  CHECK_MESSAGE(r1.code == 0, r1.output);
  std::string all = r0.output + r1.output;
  for (int rank = 0; rank < 4; ++rank) {
    std::string k = std::to_string(rank);
    CHECK_MESSAGE(contains(all, "[rank " + k + "]: allreduce rank " + k + " of 4 (local " + std::to_string(rank % 2) +
                                    "): 10 10"),
                  all);
  }
  CHECK(contains(r1.output, "[rank 2]"));
}

TEST_CASE("init_process_group without loomrun's variables says which is missing and suggests loomrun") {
  std::string command = "env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE " + worker() + " allreduce 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = ::pclose(pipe);
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(contains(output, "MASTER_ADDR"));
  CHECK(contains(output, "loomrun --nproc_per_node"));
}

TEST_CASE("--max-restarts: the whole group starts again after a failure, with the attempt in LOOM_RESTART_COUNT") {
  // Rank 1 fails in attempts 0 and 1 and succeeds in attempt 2.
  Result twice = run("--nproc_per_node 2 --grace_period 1 --max-restarts 2 " + worker() + " flaky 2");
  CHECK_MESSAGE(twice.code == 0, twice.output);
  for (const char* attempt : {"0", "1", "2"})
    for (const char* rank : {"0", "1"}) {
      CAPTURE(attempt);
      CAPTURE(rank);
      CHECK(contains(twice.output, std::string("flaky RANK=") + rank + " LOOM_RESTART_COUNT=" + attempt +
                                       " TORCHELASTIC_RESTART_COUNT=" + attempt));
    }
  CHECK_MESSAGE(contains(twice.output, "restarting all 2 workers (restart 1 of --max-restarts 2) after worker rank 1 "
                                       "exited with status 3"),
                twice.output);
  CHECK_MESSAGE(contains(twice.output, "all workers exited 0 after 2 restarts (attempt 0: worker rank 1 exited with "
                                       "status 3; attempt 1: worker rank 1 exited with status 3)"),
                twice.output);

  // Too few restarts: the last attempt's failure is loomrun's exit status.
  Result once = run("--nproc_per_node 2 --grace_period 1 --max_restarts=1 " + worker() + " flaky 2");
  CHECK(once.code == 3);
  CHECK_MESSAGE(contains(once.output, "failed: worker rank 1 (local rank 1) exited with status 3; its output above "
                                      "shows why (after 1 restart of --max-restarts 1: attempt 0: worker rank 1 "
                                      "exited with status 3)"),
                once.output);
  CHECK_FALSE(contains(once.output, "LOOM_RESTART_COUNT=2"));
  // Without --max-restarts nothing restarts, as before.
  Result none = run("--nproc_per_node 2 --grace_period 1 " + worker() + " flaky 1");
  CHECK(none.code == 3);
  CHECK_FALSE(contains(none.output, "restart"));
  CHECK(contains(run("--max-restarts -1 " + worker()).output, "--max_restarts expects an integer in [0, 1000000]"));
}
