// train_cifar10's sharded checkpoints resume under another layout (Note [Sharded
// checkpoints in train_cifar10]): 2 steps under layout A, saved; 2 more under layout B from
// that checkpoint = 4 straight steps under B. Steps 1-2 ran in A's arithmetic order, so the
// weights agree to float32 rounding, not to the bit (tests/test_resharding_checkpoint.cpp
// shows the resharding itself bitwise); the same layout resumes bitwise (test_fsdp_launch).
// SGD with momentum 0.9, so the momentum buffers must reshard with their parameters.
//
// Mutation checks (run by hand, see the commit that added this file): load_optimizer_state
// skipped in load_sharded_checkpoint (the momentum restarts from zero) fails every pair by
// ~1e-3; the FSDP1 pieces' local offsets all 0 fails every pair whose A or B is flat FSDP.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains, trainer_command
#include "nn/safetensors.h"  // defines: load_file (dcp_convert's output)
#include "saved_weights.h"   // defines: max_weight_difference, check_same_weights

using namespace loom;
using namespace loom::testing;
namespace fs = std::filesystem;

namespace {

const std::string kCommon = " --model tiny --synthetic --batch-size 12 --eval-limit 24 --threads 1 --workers 0 --quiet "
                            "--seed 5 --momentum 0.9 --checkpoint-format sharded";

struct Layout {
  std::string name;
  int ranks;
  std::string flags;
  std::string dims;  // as the resume names it
};

// Every layout trains on the same global batch of 12 with the same arithmetic up to
// rounding: --batch-size is per data-parallel rank, BatchNorm's statistics are taken over
// the whole batch (--sync-bn where the batch is split), and a pipeline runs it as one
// micro-batch.
const Layout kSingle{"single", 1, "--batch-size 12", "pp=1 dp_replicate=1 dp_shard=1 tp=1 (world 1)"};
const Layout kDdp2{"ddp 2", 2, "--dp-replicate 2 --batch-size 6 --sync-bn", "pp=1 dp_replicate=2 dp_shard=1 tp=1 (world 2)"};
const Layout kShard2{"dp_shard 2", 2, "--dp-shard 2 --fsdp-layout flat --batch-size 6 --sync-bn",
                     "pp=1 dp_replicate=1 dp_shard=2 tp=1 (world 2), FSDP1 flat shards"};
const Layout kShard3{"dp_shard 3 (FSDP2)", 3, "--dp-shard 3 --fsdp-layout per_parameter --batch-size 4 --sync-bn",
                     "pp=1 dp_replicate=1 dp_shard=3 tp=1 (world 3), FSDP2 per-parameter shards"};
const Layout kZero2{"ddp 2 + ZeRO-1", 2, "--dp-replicate 2 --zero-redundancy-optimizer --batch-size 6 --sync-bn",
                    "pp=1 dp_replicate=2 dp_shard=1 tp=1 (world 2)"};
const Layout kTp2{"tp 2", 2, "--tp 2 --batch-size 12", "pp=1 dp_replicate=1 dp_shard=1 tp=2 (world 2)"};
const Layout kPp2{"pp 2", 2, "--pp 2 --microbatches 1 --batch-size 12", "pp=2 dp_replicate=1 dp_shard=1 tp=1 (world 2)"};
const Layout kPp2Shard2{"pp 2 x dp_shard 2", 4, "--pp 2 --microbatches 1 --dp-shard 2 --fsdp-layout flat --batch-size 6 --sync-bn",
                        "pp=2 dp_replicate=1 dp_shard=2 tp=1 (world 4), FSDP1 flat shards"};
const Layout kShard2Tp2{"dp_shard 2 x tp 2", 4, "--dp-shard 2 --tp 2 --fsdp-layout flat --batch-size 6 --sync-bn",
                        "pp=1 dp_replicate=1 dp_shard=2 tp=2 (world 4), FSDP1 flat shards"};
const Layout kPp2Fsdp2{"pp 2 x dp_shard 2 (FSDP2)", 4,
                       "--pp 2 --microbatches 1 --dp-shard 2 --fsdp-layout per_parameter --batch-size 6 --sync-bn",
                       "pp=2 dp_replicate=1 dp_shard=2 tp=1 (world 4), FSDP2 per-parameter shards"};
const Layout kFsdp2Tp2{"dp_shard 2 x tp 2 (FSDP2)", 4, "--dp-shard 2 --tp 2 --fsdp-layout per_parameter --batch-size 6 --sync-bn",
                       "pp=1 dp_replicate=1 dp_shard=2 tp=2 (world 4), FSDP2 per-parameter shards"};

Result run(const Layout& layout, const std::string& flags) {
  return Launch(trainer_command(layout.ranks, kCommon + " " + layout.flags + " " + flags)).finish();
}

// 2 steps under `a`, checkpointed into <dir>/<a>; its step directory kept for every resume.
fs::path save_two_steps(const TempDir& dir, const Layout& a) {
  const fs::path ckpt = dir.path / ("saved " + a.name);
  if (fs::exists(ckpt / "step-00000002" / ".metadata")) return ckpt;
  Result r = run(a, "--max-steps 2 --checkpoint-every 2 --checkpoint-dir '" + ckpt.string() + "'");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  REQUIRE(fs::exists(ckpt / "step-00000002" / ".metadata"));
  return ckpt;
}

// The weights of 4 straight steps under `b`.
std::string four_steps(const TempDir& dir, const Layout& b) {
  const std::string want = (dir.path / ("straight " + b.name + ".safetensors")).string();
  if (!fs::exists(want)) {
    Result r = run(b, "--max-steps 4 --save '" + want + "'");
    REQUIRE_MESSAGE(r.code == 0, r.output);
  }
  return want;
}

void check_resumes(const TempDir& dir, const Layout& a, const Layout& b) {
  CAPTURE(a.name);
  CAPTURE(b.name);
  const fs::path saved = save_two_steps(dir, a);
  const fs::path copy = dir.path / ("resumed " + a.name + " to " + b.name);
  fs::copy(saved, copy, fs::copy_options::recursive);
  const std::string got = (copy / "w.safetensors").string();
  Result r = run(b, "--max-steps 4 --checkpoint-every 0 --checkpoint-dir '" + copy.string() + "' --resume --save '" +
                        got + "'");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resharded step 2 from " + a.dims + " (" + std::to_string(a.ranks) +
                                       " files) into " + b.dims),
                r.output);
  const double difference = max_weight_difference(four_steps(dir, b), got);
  MESSAGE(a.name, " -> ", b.name, ": max |w - w_straight| = ", difference);
  CHECK(difference <= 2e-5);  // float32 rounding: up to 4.7e-7 in the gcc build, 8.6e-6 in the clang one
}

// Each kind of pair in both directions: A's checkpoint under B, and B's under A.
void check_both_ways(const TempDir& dir, const Layout& a, const Layout& b) {
  check_resumes(dir, a, b);
  check_resumes(dir, b, a);
}

}  // namespace

TEST_CASE("a sharded checkpoint resumes under another layout: FSDP at other world sizes and layouts, one process, ZeRO-1") {
  TempDir dir("loom_reshard_fsdp");
  check_both_ways(dir, kSingle, kShard2);
  check_both_ways(dir, kShard2, kShard3);
  check_both_ways(dir, kDdp2, kShard3);
  check_both_ways(dir, kZero2, kShard3);  // ZeRO-1's partitioned momentum, each owner's
}

TEST_CASE("a sharded checkpoint resumes under another layout: tensor parallel and pipeline stages") {
  TempDir dir("loom_reshard_tp_pp");
  check_both_ways(dir, kDdp2, kTp2);
  check_both_ways(dir, kSingle, kPp2);
}

TEST_CASE("a sharded checkpoint resumes under another layout: the compositions") {
  TempDir dir("loom_reshard_composed");
  check_both_ways(dir, kShard2, kPp2Shard2);
  check_both_ways(dir, kTp2, kShard2Tp2);
  check_both_ways(dir, kPp2Fsdp2, kShard3);
  check_both_ways(dir, kFsdp2Tp2, kShard2Tp2);
}

TEST_CASE("a damaged set is refused, and so is a checkpoint of another model") {
  TempDir dir("loom_reshard_refused");
  const fs::path saved = save_two_steps(dir, kShard2);
  fs::remove(saved / "step-00000002" / "shard-1-of-2.safetensors");
  Result missing = run(kSingle, "--max-steps 4 --checkpoint-dir '" + saved.string() + "' --resume");
  CHECK(missing.code != 0);
  CHECK_MESSAGE(contains(missing.output, "shard-1-of-2.safetensors"), missing.output);
  const fs::path other = save_two_steps(dir, kSingle);
  Result wider = Launch(trainer_command(1, kCommon + " --model resnet18 --max-steps 4 --checkpoint-dir '" +
                                               other.string() + "' --resume")).finish();
  CHECK(wider.code != 0);
  CHECK_MESSAGE(contains(wider.output, "was saved with global shape"), wider.output);
}

TEST_CASE("dcp_convert: a sharded set as the file --save writes, and a file as a set any layout reads") {
  TempDir dir("loom_reshard_convert");
  const fs::path ckpt = dir.path / "ckpt";
  const std::string saved = (dir.path / "saved.safetensors").string();
  Result r = run(kShard2, "--max-steps 2 --checkpoint-every 2 --checkpoint-dir '" + ckpt.string() + "' --save '" +
                              saved + "'");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string tool = path_from_env("DCP_CONVERT");
  const std::string file = (dir.path / "file.safetensors").string();
  Result to_file = Launch(tool + " to-file '" + ckpt.string() + "' '" + file + "'").finish();
  REQUIRE_MESSAGE(to_file.code == 0, to_file.output);
  check_same_weights(saved, file);  // the flat shards of 2 ranks, whole again: --save's file
  check_same_weights(file, saved);  // and nothing more
  const std::string with_state = (dir.path / "with_state.safetensors").string();
  Result optim = Launch(tool + " to-file '" + ckpt.string() + "' '" + with_state + "' --with-optimizer").finish();
  REQUIRE_MESSAGE(optim.code == 0, optim.output);
  CHECK(safetensors::load_file(with_state).contains("optim.layer1.0.conv1.weight.momentum_buffer"));
  const fs::path set = dir.path / "set" / "step-00000000";
  Result to_set = Launch(tool + " to-sharded '" + file + "' '" + set.string() + "'").finish();
  REQUIRE_MESSAGE(to_set.code == 0, to_set.output);
  const std::string back = (dir.path / "back.safetensors").string();
  Result again = Launch(tool + " to-file '" + set.string() + "' '" + back + "'").finish();
  REQUIRE_MESSAGE(again.code == 0, again.output);
  check_same_weights(file, back);
  Result bad = Launch(tool + " to-file '" + (dir.path / "nothing").string() + "' x.safetensors").finish();
  CHECK(bad.code == 1);
  CHECK_MESSAGE(contains(bad.output, "is neither a complete step directory nor a checkpoint directory"), bad.output);
}
