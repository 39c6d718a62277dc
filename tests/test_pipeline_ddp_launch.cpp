// train_cifar10 --mode ddp --pp P under loomrun: pipelines of processes side by side, each
// stage data-parallel over its replicas (examples/train/parallelize.cpp, apply_ddp_to_stage).
// With one micro-batch per batch a pipeline computes exactly what one process computes,
// so P x D processes must save what --mode ddp on D processes saves from the same --init.
#include <doctest/doctest.h>

#include <string>

#include "core/tensor.h"
#include "nn/safetensors.h"   // defines: load_file
#include "process_launch.h"   // defines: Launch, Result, TempDir, path_from_env, contains
#include "saved_weights.h"    // defines: check_same_weights, progress_line

using namespace loom;
using namespace loom::testing;

namespace {

// The tiny ResNet's Sequential has 10 layers. Shuffled, augmented data: the replicas'
// DistributedSampler shards must be DDP's.
const std::string kCommon = " --model tiny --synthetic --max-steps 2 --batch-size 8 --eval-limit 40 --threads 1 "
                            "--workers 0 --quiet";


}  // namespace

TEST_CASE("--mode ddp --pp 2 on 4 processes with one micro-batch saves --mode ddp's weights on 2") {
  TempDir dir("loom_pipeline_ddp_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(train + kCommon + " --max-steps 0 --save " + init).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const std::string want = (dir.path / "ddp.safetensors").string(), got = (dir.path / "pp_dp.safetensors").string();
  Result ddp = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + kCommon + " --mode ddp --init " + init +
                      " --save " + want).finish();
  REQUIRE_MESSAGE(ddp.code == 0, ddp.output);
  Result pp_dp = Launch(loomrun + " --standalone --nproc_per_node 4 " + train + kCommon + " --mode ddp --pp 2 "
                        "--chunks 1 --balance 5,5 --init " + init + " --save " + got).finish();
  REQUIRE_MESSAGE(pp_dp.code == 0, pp_dp.output);
  // The same losses, accuracies and evaluation (rank 0's buffers on every replica).
  CHECK(progress_line(ddp.output) == progress_line(pp_dp.output));
  check_same_weights(want, got);
}

TEST_CASE("--mode ddp --pp: a world that pipelines of P stages cannot fill is refused, naming both") {
  TempDir dir("loom_pipeline_ddp_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  Result r = Launch(loomrun + " --standalone --nproc_per_node 3 " + train + kCommon + " --mode ddp --pp 2").finish();
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, "--mode ddp --pp 2: the 3 processes must split into groups of 2, but 3 is not a "
                                   "multiple of 2"),
                r.output);
  Result sync = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + kCommon + " --mode ddp --pp 2 "
                       "--sync-bn").finish();
  CHECK(sync.code != 0);
  // --mode ddp with a world of one pipeline: no replicas to synchronise BatchNorm over.
  CHECK_MESSAGE(contains(sync.output, "--sync-bn synchronises BatchNorm statistics over the data-parallel ranks, and "
                                      "this run has none (pp=2 dp_replicate=1"),
                sync.output);
}

namespace {

// "memory per rank (MiB): rank 0 peak 12.3, model state 0.2; rank 1 ...": rank's model state.
double model_state_mib(const std::string& out, int rank) {
  const std::string key = "rank " + std::to_string(rank) + " peak ";
  const size_t at = out.find(key);
  REQUIRE_MESSAGE(at != std::string::npos, out);
  const size_t state = out.find("model state ", at);
  return std::stod(out.substr(state + 12));
}

}  // namespace

// The degrees compose: a pipeline of 2 stages under the data-parallel flags, with one
// micro-batch, trains what the same flags train without the pipeline, bit for bit.
TEST_CASE("--pp 2 --dp-replicate 2 with ZeRO-1, SyncBatchNorm: one micro-batch saves the weights of the same flags without --pp") {
  TempDir dir("loom_pp_compose");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(train + kCommon + " --max-steps 0 --save " + init).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  int n = 0;
  std::string zero_run;
  for (const std::string flags : {" --dp-replicate 2 --zero-redundancy-optimizer", " --dp-replicate 2 --sync-bn"}) {
    CAPTURE(flags);
    const std::string want = (dir.path / ("flat" + std::to_string(n) + ".safetensors")).string();
    const std::string got = (dir.path / ("pp" + std::to_string(n++) + ".safetensors")).string();
    Result flat = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + kCommon + flags + " --init " + init +
                         " --save " + want).finish();
    REQUIRE_MESSAGE(flat.code == 0, flat.output);
    Result pp = Launch(loomrun + " --standalone --nproc_per_node 4 " + train + kCommon + flags +
                       " --pp 2 --microbatches 1 --balance 5,5 --init " + init + " --save " + got).finish();
    REQUIRE_MESSAGE(pp.code == 0, pp.output);
    CHECK(progress_line(flat.output) == progress_line(pp.output));
    check_same_weights(want, got);
    if (contains(flags, "zero")) zero_run = pp.output;
  }
  // ZeRO-1 did shard: each rank of a stage holds the momentum of half the stage's
  // parameters, so its model state is smaller than without it (same stage, same cut).
  Result plain = Launch(loomrun + " --standalone --nproc_per_node 4 " + train + kCommon +
                        " --dp-replicate 2 --pp 2 --microbatches 1 --balance 5,5 --init " + init).finish();
  REQUIRE_MESSAGE(plain.code == 0, plain.output);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    CHECK(model_state_mib(zero_run, rank) < model_state_mib(plain.output, rank));
  }
}

// Each rank checkpoints its own stage (sharded, with a manifest): 2 steps, then a resumed
// run to 4, save what 4 straight steps save.
TEST_CASE("--pp 2 --dp-replicate 2 --checkpoint-dir: 2 steps, then --resume to 4, equals 4 straight steps, bit for bit") {
  TempDir dir("loom_pp_resume");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const std::string run = loomrun + " --standalone --nproc_per_node 4 " + train +
                          " --model tiny --synthetic --batch-size 8 --eval-limit 40 --threads 1 --workers 0 --quiet "
                          "--pp 2 --dp-replicate 2 --microbatches 2 --seed 5";
  const std::string want = (dir.path / "straight.safetensors").string(), got = (dir.path / "resumed.safetensors").string();
  const std::string ckpt = (dir.path / "ckpt").string();
  Result straight = Launch(run + " --max-steps 4 --save " + want).finish();
  REQUIRE_MESSAGE(straight.code == 0, straight.output);
  Result first = Launch(run + " --max-steps 2 --checkpoint-dir " + ckpt).finish();
  REQUIRE_MESSAGE(first.code == 0, first.output);
  Result second = Launch(run + " --max-steps 4 --checkpoint-dir " + ckpt + " --resume --save " + got).finish();
  REQUIRE_MESSAGE(second.code == 0, second.output);
  CHECK_MESSAGE(contains(second.output, "resumed from"), second.output);
  check_same_weights(want, got);
  Result full = Launch(run + " --max-steps 1 --checkpoint-dir " + ckpt + " --checkpoint-format full").finish();
  CHECK(full.code != 0);
  CHECK_MESSAGE(contains(full.output, "--checkpoint-format full with --pp 2: each stage's optimizer state lives on its "
                                      "own ranks"),
                full.output);
}
