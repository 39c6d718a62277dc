// Elastic restarts, end to end: `kill -9` of one rank of train_cifar10 --mode ddp in the
// middle of an epoch, under loomrun --max-restarts 1. loomrun starts the group again,
// the trainer resumes from its last complete checkpoint (Note [Resuming after a restart]
// in train/checkpoint.h), and the final weights equal an uninterrupted run's
// bit for bit -- on one node, and on two "nodes" (two loomruns on localhost, where the
// store's restart generation keeps the attempts apart: Note [Restart generations]).
// The same with --mode fsdp, whose checkpoints are sharded: every rank's shard, then the
// manifest (Note [Sharded checkpoints in train_cifar10], train/sharded_checkpoint.h).
// meson passes the launcher's and the trainer's paths in LOOMRUN and TRAIN_CIFAR10.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "parallel/store/socket.h"  // defines: net::find_free_port
#include "process_launch.h"         // defines: Launch, Result, TempDir, path_from_env, contains

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::testing;
using namespace std::chrono_literals;

namespace {

// 16 steps of 8 images per rank: an epoch of the synthetic set is 3125 steps, so the
// kill lands mid-epoch. No --quiet: rank 0 says where it resumed.
const std::string kCommonArgs = " --model tiny --synthetic --max-steps 16 --batch-size 8 --eval-limit 16 --threads 1 "
                                "--workers 0";
const std::string kTrainArgs = " --mode ddp" + kCommonArgs;
const std::string kFsdpArgs = " --mode fsdp --sharding-strategy full_shard" + kCommonArgs;

// The pid of the worker with RANK=rank in attempt 0 of the job marked `mark`, or 0.
pid_t find_worker(const std::string& mark, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(in)), {});
    auto has = [&](const std::string& var) { return env.find('\0' + var + '\0') != std::string::npos; };
    if (has("LOOM_TEST_MARK=" + mark) && has("RANK=" + std::to_string(rank)) && has("LOOM_RESTART_COUNT=0"))
      return static_cast<pid_t>(std::stol(name));
  }
  return 0;
}

// A full checkpoint's file, or a sharded one's manifest (written last).
bool has_checkpoint(const fs::path& checkpoint_dir) {
  if (fs::exists(checkpoint_dir / "checkpoint.safetensors")) return true;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, error))
    if (fs::exists(entry.path() / ".metadata")) return true;
  return false;
}

// Waits for the first checkpoint, then kills rank `rank` of attempt 0 with SIGKILL.
void kill_after_first_checkpoint(const fs::path& checkpoint_dir, const std::string& mark, int rank) {
  const auto until = std::chrono::steady_clock::now() + 120s;
  while (!has_checkpoint(checkpoint_dir)) {
    REQUIRE_MESSAGE(std::chrono::steady_clock::now() < until, "no checkpoint appeared");
    std::this_thread::sleep_for(5ms);
  }
  pid_t pid = find_worker(mark, rank);
  REQUIRE_MESSAGE(pid > 0, "rank ", rank, " of attempt 0 is not running");
  REQUIRE(::kill(pid, SIGKILL) == 0);
}

std::string fresh_mark() { return std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()); }

// The cases of one mode compare with the same uninterrupted run; it is made once.
std::string reference_weights(const fs::path& dir, const std::string& args = kTrainArgs, int nproc = 2) {
  static std::map<std::string, std::string> cached;
  if (cached.count(args)) return cached[args];
  const fs::path weights = dir / "uninterrupted.safetensors";
  Result r = Launch(path_from_env("LOOMRUN") + " --standalone --nproc_per_node " + std::to_string(nproc) + " " +
                    path_from_env("TRAIN_CIFAR10") +
                    args + " --quiet --save " + weights.string())
                 .finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  return cached[args] = read_file(weights);
}

void check_resumed(const std::string& output) {
  CHECK_MESSAGE(contains(output, "was killed by signal 9"), output);
  CHECK_MESSAGE(contains(output, "restarting all "), output);
  CHECK_MESSAGE(contains(output, "all workers exited 0 after 1 restart (attempt 0: worker rank "), output);
  CHECK_MESSAGE(contains(output, "resumed from "), output);  // not trained again from scratch
}

// One node, `nproc` ranks, `args`, checkpoints every 4 steps under --max-restarts 1: rank 1 is
// killed after the first checkpoint; the job must finish, resumed, with the reference's
// weights bit for bit. Returns loomrun's output.
std::string kill_one_rank_and_compare(const fs::path& dir, const std::string& args, int nproc = 2) {
  const std::string reference = reference_weights(dir, args, nproc);
  REQUIRE(reference.size() > 10000);
  const fs::path checkpoints = dir / "ckpt", weights = dir / "restarted.safetensors";
  const std::string mark = fresh_mark();
  Launch job("LOOM_TEST_MARK=" + mark + " " + path_from_env("LOOMRUN") +
             " --standalone --nproc_per_node " + std::to_string(nproc) + " --max-restarts 1 --grace_period 1 " +
             path_from_env("TRAIN_CIFAR10") + args + " --checkpoint-dir " + checkpoints.string() + " --checkpoint-every 4 --save " + weights.string());
  kill_after_first_checkpoint(checkpoints, mark, 1);
  Result r = job.finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  check_resumed(r.output);
  CHECK(read_file(weights) == reference);  // bitwise
  return r.output;
}

}  // namespace

TEST_CASE("kill -9 of a rank mid-epoch under --max-restarts 1: restart, resume, same weights bit for bit") {
  TempDir dir("loom_elastic");
  const std::string output = kill_one_rank_and_compare(dir.path, kTrainArgs);
  CHECK_MESSAGE(contains(output, "worker rank 1 (local rank 1, pid "), output);
}

TEST_CASE("two nodes on localhost: each loomrun restarts its own workers; same weights bit for bit") {
  TempDir dir("loom_elastic");
  const std::string reference = reference_weights(dir.path);

  const fs::path checkpoints = dir.path / "ckpt", weights = dir.path / "restarted.safetensors";
  const std::string mark = fresh_mark();
  const std::string node = " --nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port " +
                           std::to_string(distributed::net::find_free_port()) + " --max-restarts 1 --grace_period 1 ";
  const std::string train = path_from_env("TRAIN_CIFAR10") + kTrainArgs + " --checkpoint-dir " + checkpoints.string() +
                            " --checkpoint-every 4 --save " + weights.string();
  const std::string loomrun = "LOOM_TEST_MARK=" + mark + " " + path_from_env("LOOMRUN");
  Launch node1(loomrun + " --node_rank 1" + node + train);
  Launch node0(loomrun + " --node_rank 0" + node + train);
  kill_after_first_checkpoint(checkpoints, mark, 1);  // node 1's worker
  Result r0 = node0.finish(), r1 = node1.finish();
  REQUIRE_MESSAGE(r1.code == 0, r1.output);
  REQUIRE_MESSAGE(r0.code == 0, r0.output);
  check_resumed(r1.output + r0.output);
  // Node 0's worker failed too (its peer vanished mid-collective) and was restarted by
  // its own loomrun.
  CHECK_MESSAGE(contains(r0.output, "all workers exited 0 after 1 restart (attempt 0: worker rank 0"), r0.output);
  CHECK(read_file(weights) == reference);
}

TEST_CASE("--mode fsdp, sharded checkpoints: kill -9 mid-epoch, restart from the newest complete set, same weights") {
  TempDir dir("loom_elastic");
  const std::string output = kill_one_rank_and_compare(dir.path, kFsdpArgs);
  const fs::path checkpoints = dir.path / "ckpt";
  CHECK_MESSAGE(contains(output, "resumed from " + (checkpoints / "step-").string()), output);
  // What is left: the last step's set, complete, and the one before it as a fallback.
  CHECK(fs::exists(checkpoints / "step-00000016" / ".metadata"));
  CHECK(fs::exists(checkpoints / "step-00000016" / "shard-1-of-2.safetensors"));
  CHECK(fs::exists(checkpoints / "step-00000012" / ".metadata"));
  CHECK(!fs::exists(checkpoints / "step-00000004"));
}

// The guide's recipe under a failure: a pipeline of 2 stages, each sharded over 2 ranks
// (FSDP per stage), each rank checkpointing its own shards of its stage.
TEST_CASE("kill -9 of a rank under --pp 2 --dp-shard 2 --max-restarts 1: restart, resume, same weights bit for bit") {
  TempDir dir("loom_elastic_pp_fsdp");
  const std::string output =
      kill_one_rank_and_compare(dir.path, " --pp 2 --dp-shard 2 --microbatches 2" + kCommonArgs, /*nproc=*/4);
  CHECK_MESSAGE(contains(output, "worker rank 1 (local rank 1, pid "), output);
}
