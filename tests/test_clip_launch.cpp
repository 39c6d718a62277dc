// train_cifar10 --clip-grad-norm: the whole model's gradient norm, however the model is cut
// (train/grad_clipping.h). With clipping active at every step, each cut trains as
// the run it must equal from the same --init: --tp and --pp as one process, --dp-shard as
// --dp-replicate. Sums in another order differ in the last bits only (float32, <= 1e-5).
#include <doctest/doctest.h>

#include <string>

#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains, under_loomrun
#include "saved_weights.h"   // defines: max_weight_difference

using namespace loom;
using namespace loom::testing;

namespace {

// lr 0.02: clipped at 0.5 every step, and far enough from where the tiny model's steps
// amplify last-bit differences.
const std::string kCommon = " --model tiny --synthetic --max-steps 3 --eval-limit 0 --threads 1 --workers 0 --quiet "
                            "--lr 0.02";

std::string train(int ranks, const std::string& flags) { return trainer_command(ranks, kCommon + " " + flags); }

std::string saved(const TempDir& dir, int ranks, const std::string& flags, const std::string& name) {
  return run_saving_weights(dir, train(ranks, flags), name);
}

}  // namespace

TEST_CASE("--clip-grad-norm clips by the whole model's norm under --tp, --pp and --dp-shard (FSDP1 and FSDP2), and their compositions") {
  TempDir dir("loom_clip");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(path_from_env("TRAIN_CIFAR10") + kCommon + " --max-steps 0 --save " + init).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const std::string whole = " --batch-size 16 --clip-grad-norm 0.5 --init " + init;
  const std::string one = saved(dir, 1, whole, "one");
  CHECK(max_weight_difference(one, saved(dir, 1, whole + " --clip-grad-norm 0", "unclipped")) > 1e-3);  // it clips
  CHECK(max_weight_difference(one, saved(dir, 2, whole + " --tp 2", "tp")) <= 1e-5);
  CHECK(max_weight_difference(one, saved(dir, 2, whole + " --pp 2 --microbatches 1 --balance 5,5", "pp")) <= 1e-5);
  const std::string halves = " --batch-size 8 --clip-grad-norm 0.5 --init " + init;
  const std::string ddp = saved(dir, 2, halves + " --dp-replicate 2", "ddp");
  CHECK(max_weight_difference(ddp, saved(dir, 2, halves + " --dp-shard 2 --fsdp-layout flat", "fsdp")) <= 1e-5);
  Result mixed = Launch(train(4, halves + " --dp-shard 2 --tp 2 --fsdp-layout flat")).finish();
  CHECK(mixed.code != 0);
  CHECK_MESSAGE(contains(mixed.output, "FSDP's flat shards mix tensor-parallel shards"), mixed.output);
  // FSDP2's rows of tp shards and of whole tensors are counted apart: the norm of one process.
  CHECK(max_weight_difference(ddp, saved(dir, 4, halves + " --dp-shard 2 --tp 2 --fsdp-layout per_parameter",
                                         "fsdp2_x_tp")) <= 1e-5);
  CHECK(max_weight_difference(ddp, saved(dir, 2, halves + " --dp-shard 2 --fsdp-layout per_parameter", "fsdp2")) <= 1e-5);
  CHECK(max_weight_difference(ddp, saved(dir, 4, halves + " --pp 2 --microbatches 1 --balance 5,5 --dp-shard 2 "
                                                           "--fsdp-layout per_parameter", "pp_x_fsdp2")) <= 1e-5);
}
