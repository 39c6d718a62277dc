// train_cifar10 --pp P --dp-shard S under loomrun: the guide's recipe for a model too large
// for one device, a pipeline whose every stage is sharded (FSDP on each stage's model
// chunks, parallel/pipeline/stage_sharding.h). With one micro-batch a pipeline computes
// exactly what one process computes, so pp x dp_shard must save what --dp-shard alone
// saves from the same --init, and pp x dp_replicate x dp_shard what HSDP saves; each rank
// checkpoints its own shards of its stage and a resumed run continues bit for bit.
#include <doctest/doctest.h>

#include <string>

#include "core/tensor.h"
#include "nn/safetensors.h"   // defines: load_file
#include "process_launch.h"   // defines: Launch, Result, TempDir, path_from_env, contains
#include "saved_weights.h"    // defines: check_same_weights, progress_line

using namespace loom;
using namespace loom::testing;

namespace {

// The tiny ResNet's Sequential has 10 layers. Shuffled, augmented data: the shards'
// DistributedSampler must be the same with and without the pipeline.
const std::string kCommon = " --model tiny --synthetic --max-steps 2 --batch-size 8 --eval-limit 40 --threads 1 "
                            "--workers 0 --quiet";



}  // namespace

TEST_CASE("--pp 2 --dp-shard 2 (and x --dp-replicate 2) with one micro-batch saves the weights of the same flags without --pp") {
  TempDir dir("loom_pp_fsdp");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(train + kCommon + " --max-steps 0 --save " + init).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  struct Case {
    std::string flags;
    int ranks;  // without the pipeline
  };
  int n = 0;
  for (const Case& c : {Case{" --dp-shard 2", 2}, Case{" --dp-replicate 2 --dp-shard 2", 4}}) {
    CAPTURE(c.flags);
    const std::string want = (dir.path / ("flat" + std::to_string(n) + ".safetensors")).string();
    const std::string got = (dir.path / ("pp" + std::to_string(n++) + ".safetensors")).string();
    Result flat = Launch(loomrun + " --standalone --nproc_per_node " + std::to_string(c.ranks) + " " + train + kCommon +
                         c.flags + " --init " + init + " --save " + want).finish();
    REQUIRE_MESSAGE(flat.code == 0, flat.output);
    Result pp = Launch(loomrun + " --standalone --nproc_per_node " + std::to_string(2 * c.ranks) + " " + train +
                       kCommon + c.flags + " --pp 2 --microbatches 1 --balance 5,5 --init " + init + " --save " + got)
                    .finish();
    REQUIRE_MESSAGE(pp.code == 0, pp.output);
    CHECK(progress_line(flat.output) == progress_line(pp.output));
    check_same_weights(want, got);
  }
}

TEST_CASE("--pp 2 --dp-shard 2 --checkpoint-dir: 2 steps, then --resume to 4, equals 4 straight steps, bit for bit") {
  TempDir dir("loom_pp_fsdp_resume");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const std::string run = loomrun + " --standalone --nproc_per_node 4 " + train +
                          " --model tiny --synthetic --batch-size 8 --eval-limit 40 --threads 1 --workers 0 --quiet "
                          "--pp 2 --dp-shard 2 --microbatches 2 --seed 5";
  const std::string want = (dir.path / "straight.safetensors").string(), got = (dir.path / "resumed.safetensors").string();
  const std::string ckpt = (dir.path / "ckpt").string();
  Result straight = Launch(run + " --max-steps 4 --save " + want).finish();
  REQUIRE_MESSAGE(straight.code == 0, straight.output);
  Result first = Launch(run + " --max-steps 2 --checkpoint-dir " + ckpt).finish();
  REQUIRE_MESSAGE(first.code == 0, first.output);
  Result second = Launch(run + " --max-steps 4 --checkpoint-dir " + ckpt + " --resume --save " + got).finish();
  REQUIRE_MESSAGE(second.code == 0, second.output);
  CHECK_MESSAGE(contains(second.output, "resumed from"), second.output);
  CHECK(progress_line(straight.output) == progress_line(second.output));
  check_same_weights(want, got);
}

// --metrics-json's comm_bytes_per_step: under pp x FSDP each stage's parameters are
// gathered once per step, whatever the micro-batches (they stay gathered from the first
// forward to the last backward), and their gradients reduce-scattered once: the two
// kinds move the same bytes, (N-1)/N * 4 * Psi_stage each. Activations cross the cut
// forward (send on stage 0) and gradients back (recv).
TEST_CASE("--pp 2 --dp-shard 2 --metrics-json: one all-gather and one reduce-scatter of the stage per step; always: more gathers") {
  TempDir dir("loom_pp_fsdp_bytes");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  // One run's rank-0 bytes per step of `kind`.
  auto bytes = [&](const std::string& reshard, const std::string& kind) {
    const std::string json = (dir.path / ("m_" + reshard + ".json")).string();
    Result r = Launch(loomrun + " --standalone --nproc_per_node 4 " + train + kCommon +
                      " --pp 2 --dp-shard 2 --microbatches 4 --balance 5,5 --reshard-after-forward " + reshard +
                      " --metrics-json " + json).finish();
    REQUIRE_MESSAGE(r.code == 0, r.output);
    const std::string text = read_file(json);
    const size_t at = text.find("\"" + kind + "\": ", text.find("comm_bytes_per_step"));
    REQUIRE_MESSAGE(at != std::string::npos, text);
    return std::stoll(text.substr(at + kind.size() + 4));
  };
  CHECK(bytes("default", "all_gather") > 0);
  CHECK(bytes("default", "all_gather") == bytes("default", "reduce_scatter"));
  CHECK(bytes("default", "send") >= bytes("default", "recv"));  // stage 0 sends activations, receives gradients
  CHECK(bytes("default", "recv") > 0);
  // --reshard-after-forward always: FULL_SHARD per micro-batch, a stage's units gathered
  // again for every forward and backward; the gradients are still reduce-scattered once.
  CHECK(bytes("always", "all_gather") > 4 * bytes("default", "all_gather"));
  CHECK(bytes("always", "reduce_scatter") == bytes("default", "reduce_scatter"));
}
