// A tiny worker program for test_loomrun: what loomrun starts, in several behaviours.
//
//   loomrun_worker env              print the variables loomrun set
//   loomrun_worker affinity         print the CPUs this worker may run on (the kernel's list)
//   loomrun_worker allreduce        init_process_group, all_reduce(rank + 1), print the sum
//   loomrun_worker crash DIR        record pids in DIR; rank 1 exits with status 3
//   loomrun_worker stubborn DIR     as crash, but the others ignore SIGTERM
//   loomrun_worker sleep DIR        record pids in DIR and sleep (to be interrupted)
//   loomrun_worker flaky N          print the restart count; rank 1 exits 3 while it is below N
//
// Every worker that records pids also starts a child process, so the tests can check
// that loomrun leaves no descendant behind either.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "core/factory.h"
#include "parallel/comm/process_group.h"

static std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

static void record_pid(const std::string& dir, const std::string& name, pid_t pid) {
  std::ofstream(dir + "/" + name) << pid << "\n";
}

// Records this worker's pid and starts a child that would outlive it if nobody killed it.
static void record_family(const std::string& dir, int rank) {
  record_pid(dir, "worker." + std::to_string(rank), ::getpid());
  pid_t child = ::fork();
  if (child < 0) std::perror("fork");
  if (child == 0) {
    ::sleep(60);
    ::_exit(0);
  }
  record_pid(dir, "child." + std::to_string(rank), child);
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") {
    std::printf("env RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s\n",
                env("RANK").c_str(), env("LOCAL_RANK").c_str(), env("WORLD_SIZE").c_str(),
                env("LOCAL_WORLD_SIZE").c_str(), env("MASTER_ADDR").c_str(), env("MASTER_PORT").c_str());
    return 0;
  }
  if (mode == "affinity") {
    std::ifstream status("/proc/self/status");
    std::string line, cpus = "<unknown>";
    while (std::getline(status, line))
      if (line.rfind("Cpus_allowed_list:", 0) == 0) cpus = line.substr(line.find_first_not_of(" \t", 18));
    std::printf("affinity RANK=%s CPUS=%s OMP_NUM_THREADS=%s\n", env("RANK").c_str(), cpus.c_str(),
                env("OMP_NUM_THREADS").c_str());
    return 0;
  }
  if (mode == "allreduce") {
    namespace dist = loom::distributed;
    try {
      dist::init_process_group("gloo", "env://", std::chrono::seconds(30));
      loom::Tensor t = loom::full({2}, dist::get_rank() + 1);
      dist::all_reduce(t);
      std::printf("allreduce rank %d of %d (local %d): %g %g\n", dist::get_rank(), dist::get_world_size(),
                  dist::get_local_rank(), t.tolist<float>()[0], t.tolist<float>()[1]);
      std::fflush(stdout);
      dist::destroy_process_group();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "worker error: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (mode == "flaky" && argc > 2) {
    const int attempt = std::atoi(env("LOOM_RESTART_COUNT").c_str());
    std::printf("flaky RANK=%s LOOM_RESTART_COUNT=%s TORCHELASTIC_RESTART_COUNT=%s\n", env("RANK").c_str(),
                env("LOOM_RESTART_COUNT").c_str(), env("TORCHELASTIC_RESTART_COUNT").c_str());
    std::fflush(stdout);
    const bool fails = attempt < std::atoi(argv[2]);
    if (env("RANK") == "1") {
      if (fails) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the others print first
      return fails ? 3 : 0;
    }
    if (fails) ::sleep(60);  // until loomrun stops it, since rank 1 failed
    return 0;
  }
  if ((mode == "crash" || mode == "stubborn" || mode == "sleep") && argc > 2) {
    const int rank = std::atoi(env("RANK").c_str());
    if (mode == "stubborn") ::signal(SIGTERM, SIG_IGN);  // inherited by the child as well
    record_family(argv[2], rank);
    if (mode != "sleep" && rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      std::fprintf(stderr, "rank 1 fails on purpose\n");
      return 3;
    }
    ::sleep(60);
    return 0;
  }
  std::fprintf(stderr, "usage: loomrun_worker env|affinity|allreduce|crash DIR|stubborn DIR|sleep DIR|flaky N\n");
  return 2;
}
