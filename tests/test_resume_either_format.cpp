// --resume finds whatever --checkpoint-dir holds (Note [Resuming either format],
// train/checkpoint.h): a full checkpoint under a layout that writes sharded ones, a sharded
// set under --mode ddp or in one process, the later of the two when both are there.
//
// Each cross-format resume is held to the same-format resume of the same state: 2 steps
// under layout A saved in both formats (the same arithmetic, so the same state), each
// resumed to 4 steps under layout B; the two runs of B must agree to the bit, since they
// start from the same weights, momentum, schedule and generator. (How B's steps compare with
// A's is test_resharding_launch's question.)
//
// Mutation checks (by hand, see the commit): the optimizer state left out of
// load_full_checkpoint_as_pieces (momentum from zero) fails the --pp 2 and --tp 2 pairs;
// the checkpoint's kind chosen by --checkpoint-format again fails every resume with "no
// checkpoint in"; the earlier step chosen when both are there fails the third case.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "process_launch.h"  // defines: Launch, Result, TempDir, contains, trainer_command
#include "saved_weights.h"   // defines: check_same_weights

using namespace loom::testing;
namespace fs = std::filesystem;

namespace {

// No augmentation: the ranks' generators (restored per rank from a sharded set, from rank
// 0's from a full file) draw nothing, so the two formats' resumes may agree to the bit.
const std::string kCommon = " --model tiny --synthetic --batch-size 12 --eval-limit 24 --threads 1 --workers 0 --quiet "
                            "--seed 5 --momentum 0.9 --no-augment";

struct Layout {
  std::string name;
  int ranks;
  std::string flags;
};

// Each the same global batch of 12 (Note in test_resharding_launch.cpp).
const Layout kSingle{"single", 1, "--batch-size 12"};
const Layout kDdp2{"ddp 2", 2, "--mode ddp --batch-size 6 --sync-bn"};
const Layout kShard2{"dp_shard 2", 2, "--dp-shard 2 --batch-size 6 --sync-bn"};
const Layout kTp2{"tp 2", 2, "--tp 2 --batch-size 12"};
const Layout kPp2{"pp 2", 2, "--pp 2 --microbatches 1 --batch-size 12"};

Result run(const Layout& layout, const std::string& flags) {
  return Launch(trainer_command(layout.ranks, kCommon + " " + layout.flags + " " + flags)).finish();
}

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

// 2 steps under `a` saved in `format` (full or sharded) into <dir>/<a> <format>.
fs::path save_two_steps(const TempDir& dir, const Layout& a, const std::string& format) {
  const fs::path ckpt = dir.path / (a.name + " " + format);
  Result r = run(a, "--max-steps 2 --checkpoint-every 2 --checkpoint-format " + format + " --checkpoint-dir " +
                        quoted(ckpt));
  REQUIRE_MESSAGE(r.code == 0, r.output);
  return ckpt;
}

// A copy of `saved` resumed to 4 steps under `b`, which names no --checkpoint-format: the
// weights' path. The run must say which kind it loaded.
std::string resume_to_four(const TempDir& dir, const fs::path& saved, const Layout& b, const std::string& kind) {
  const fs::path copy = dir.path / (saved.filename().string() + " under " + b.name);
  fs::copy(saved, copy, fs::copy_options::recursive);
  const std::string weights = (copy / "w.safetensors").string();
  Result r = run(b, "--max-steps 4 --checkpoint-every 0 --resume --checkpoint-dir " + quoted(copy) + " --save '" +
                        weights + "'");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string from = kind == "full" ? (copy / "checkpoint.safetensors").string() : (copy / "step-00000002").string();
  CHECK_MESSAGE(contains(r.output, "resumed from " + from + " (a " + kind + " checkpoint) at epoch 1, step 2"), r.output);
  return weights;
}

}  // namespace

TEST_CASE("a full checkpoint resumes under layouts that write sharded ones, as the same state saved sharded does") {
  TempDir dir("loom_resume_full");
  const fs::path full = save_two_steps(dir, kSingle, "full");
  const fs::path sharded = save_two_steps(dir, kSingle, "sharded");
  for (const Layout& b : {kShard2, kPp2, kTp2}) {  // FSDP takes the whole state; --pp, --tp read it as pieces
    CAPTURE(b.name);
    check_same_weights(resume_to_four(dir, sharded, b, "sharded"), resume_to_four(dir, full, b, "full"));
  }
}

TEST_CASE("a sharded set resumes under --mode ddp and in one process, as the same state saved full does") {
  TempDir dir("loom_resume_sharded");
  const fs::path sharded = save_two_steps(dir, kShard2, "sharded");
  const fs::path full = save_two_steps(dir, kShard2, "full");
  for (const Layout& b : {kDdp2, kSingle}) {
    CAPTURE(b.name);
    check_same_weights(resume_to_four(dir, full, b, "full"), resume_to_four(dir, sharded, b, "sharded"));
  }
}

TEST_CASE("when the folder holds both kinds, the later step wins and the run says so; a first start removes both") {
  TempDir dir("loom_resume_both");
  const fs::path ckpt = dir.path / "ckpt";
  const std::string at = " --checkpoint-every 0 --checkpoint-dir " + quoted(ckpt);
  REQUIRE(run(kSingle, "--max-steps 2" + at).code == 0);  // full, step 2
  Result r = run(kShard2, "--max-steps 4 --resume" + at);  // + sharded, step 4
  REQUIRE_MESSAGE(r.code == 0, r.output);
  REQUIRE(fs::exists(ckpt / "checkpoint.safetensors"));
  REQUIRE(fs::exists(ckpt / "step-00000004" / ".metadata"));

  r = run(kSingle, "--max-steps 6 --resume" + at);  // writes full, step 6
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, ckpt.string() + " holds a full checkpoint at step 2 and a sharded one at step 4: "
                                   "resuming from the sharded one (the later step)"), r.output);
  CHECK_MESSAGE(contains(r.output, "resumed from " + (ckpt / "step-00000004").string() + " (a sharded checkpoint) at "
                                   "epoch 1, step 4"), r.output);

  r = run(kShard2, "--max-steps 8 --resume" + at);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, ckpt.string() + " holds a full checkpoint at step 6 and a sharded one at step 4: "
                                   "resuming from the full one (the later step)"), r.output);
  CHECK_MESSAGE(contains(r.output, "step 6"), r.output);

  // A first start (no --resume) trains from scratch and removes both kinds (said even under
  // --quiet), so that a restart before its first checkpoint cannot continue an earlier run.
  r = run(kSingle, "--max-steps 1" + at);
  REQUIRE_MESSAGE(r.code == 0, r.output);
  // Three: the full one at step 6, and the sharded step 8 with its fallback, step 4.
  CHECK_MESSAGE(contains(r.output, ckpt.string() + ": removed 3 checkpoints of an earlier run"), r.output);
  for (const auto& entry : fs::directory_iterator(ckpt))  // this run's checkpoint at its stop, and its settings
    CHECK_MESSAGE((entry.path().filename() == "checkpoint.safetensors" || entry.path().filename() == "config.toml"),
                  entry.path());
}
