// train_cifar10 with --pp and the data-parallel degrees under loomrun: pipelines of
// processes side by side, each stage replicated (--dp-replicate: DDP, with ZeRO-1 or
// SyncBatchNorm), sharded (--dp-shard: FSDP on each stage's virtual stages) or both (HSDP),
// as train/parallelize.cpp composes them. With one micro-batch per batch a
// pipeline computes exactly what one process computes, so P x D processes must save what
// the same flags without --pp save on D processes from the same --init; each rank
// checkpoints its own stage, and a resumed run continues bit for bit.
#include <doctest/doctest.h>

#include <string>

#include "process_launch.h"   // defines: Launch, Result, TempDir, path_from_env, contains, read_file, under_loomrun
#include "saved_weights.h"    // defines: check_same_weights, progress_line

using namespace loom;
using namespace loom::testing;

namespace {

// The tiny ResNet's Sequential has 10 layers. Shuffled, augmented data: the replicas'
// DistributedSampler shards must be the same with and without the pipeline.
const std::string kCommon = " --model tiny --synthetic --max-steps 2 --batch-size 8 --eval-limit 40 --threads 1 "
                            "--workers 0 --quiet";

// "memory per rank (MiB): rank 0 peak 12.3, model state 0.2; rank 1 ...": rank's model state.
double model_state_mib(const std::string& out, int rank) {
  const std::string key = "rank " + std::to_string(rank) + " peak ";
  const size_t at = out.find(key);
  REQUIRE_MESSAGE(at != std::string::npos, out);
  const size_t state = out.find("model state ", at);
  return std::stod(out.substr(state + 12));
}

// `flags` on `ranks` processes, then with --pp 2 and one micro-batch on twice as many,
// from the same --init: the same progress line and weights, bit for bit. Returns the
// pipeline run's output.
std::string check_pipeline_trains_alike(const TempDir& dir, const std::string& flags, int ranks) {
  const std::string train = path_from_env("TRAIN_CIFAR10");
  const std::string init = (dir.path / "init.safetensors").string();
  if (read_file(init).empty()) {
    Result made = Launch(train + kCommon + " --max-steps 0 --save " + init).finish();
    REQUIRE_MESSAGE(made.code == 0, made.output);
  }
  const std::string want = (dir.path / "flat.safetensors").string(), got = (dir.path / "pp.safetensors").string();
  Result flat = Launch(under_loomrun(ranks, train + kCommon + flags + " --init " + init + " --save " + want)).finish();
  REQUIRE_MESSAGE(flat.code == 0, flat.output);
  Result pp = Launch(under_loomrun(2 * ranks, train + kCommon + flags + " --pp 2 --microbatches 1 --balance 5,5 --init " +
                                                 init + " --save " + got)).finish();
  REQUIRE_MESSAGE(pp.code == 0, pp.output);
  // The same losses, accuracies and evaluation (rank 0's buffers on every replica).
  CHECK(progress_line(flat.output) == progress_line(pp.output));
  check_same_weights(want, got);
  return pp.output;
}

// 2 steps checkpointed (each rank its stage: sharded, with a manifest), then resumed to
// 4, save what 4 straight steps save.
void check_resumes_exactly(const TempDir& dir, const std::string& flags) {
  const std::string run = path_from_env("LOOMRUN") + " --standalone --nproc_per_node 4 " +
                          path_from_env("TRAIN_CIFAR10") +
                          " --model tiny --synthetic --batch-size 8 --eval-limit 40 --threads 1 --workers 0 --quiet "
                          "--pp 2 --microbatches 2 --seed 5" + flags;
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

}  // namespace

TEST_CASE("--pp 2 with --mode ddp, --dp-replicate 2 + ZeRO-1, + SyncBatchNorm: one micro-batch trains as without --pp") {
  TempDir dir("loom_pp_replicate");
  check_pipeline_trains_alike(dir, " --mode ddp", 2);
  const std::string zero = check_pipeline_trains_alike(dir, " --dp-replicate 2 --zero-redundancy-optimizer", 2);
  check_pipeline_trains_alike(dir, " --dp-replicate 2 --sync-bn", 2);
  // ZeRO-1 did shard: each rank of a stage holds the momentum of half the stage's
  // parameters, so its model state is smaller than without it (same stage, same cut).
  Result plain = Launch(path_from_env("LOOMRUN") + " --standalone --nproc_per_node 4 " + path_from_env("TRAIN_CIFAR10") +
                        kCommon + " --dp-replicate 2 --pp 2 --microbatches 1 --balance 5,5").finish();
  REQUIRE_MESSAGE(plain.code == 0, plain.output);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    CHECK(model_state_mib(zero, rank) < model_state_mib(plain.output, rank));
  }
}

// The guide's recipe for a model too large for one device: a pipeline whose every stage
// is sharded.
TEST_CASE("--pp 2 with --dp-shard 2 (FSDP1 and FSDP2, + SyncBatchNorm), and with --dp-replicate 2 --dp-shard 2 (HSDP): one micro-batch trains as without --pp") {
  TempDir dir("loom_pp_shard");
  check_pipeline_trains_alike(dir, " --dp-shard 2 --fsdp-layout flat", 2);  // FSDP1's flat shards on each stage
  check_pipeline_trains_alike(dir, " --dp-shard 2", 2);                       // FSDP2 on each stage (the default)
  check_pipeline_trains_alike(dir, " --dp-shard 2 --sync-bn", 2);
  check_pipeline_trains_alike(dir, " --dp-replicate 2 --dp-shard 2", 4);
}

TEST_CASE("--pp 2 --checkpoint-dir, with --dp-replicate 2 or --dp-shard 2: 2 steps, then --resume to 4, equals 4 straight") {
  {
    TempDir dir("loom_pp_resume_replicate");
    check_resumes_exactly(dir, " --dp-replicate 2");
    Result full = Launch(path_from_env("LOOMRUN") + " --standalone --nproc_per_node 4 " + path_from_env("TRAIN_CIFAR10") +
                         kCommon + " --pp 2 --dp-replicate 2 --max-steps 1 --checkpoint-dir " +
                         (dir.path / "full").string() + " --checkpoint-format full").finish();
    CHECK(full.code != 0);
    CHECK_MESSAGE(contains(full.output, "--checkpoint-format full with --pp 2: each stage's optimizer state lives on "
                                        "its own ranks"),
                  full.output);
  }
  TempDir dir("loom_pp_resume_shard");
  check_resumes_exactly(dir, " --dp-shard 2");
}

TEST_CASE("flags a world cannot run are refused before training, each error naming what it should") {
  // `flags` on `ranks` processes fails, saying `message`.
  auto refused = [](int ranks, const std::string& flags, const std::string& message) {
    Result r = Launch(under_loomrun(ranks, path_from_env("TRAIN_CIFAR10") + kCommon + flags)).finish();
    CHECK_MESSAGE(r.code != 0, flags);
    CHECK_MESSAGE(contains(r.output, message), r.output);
  };
  // A world that pipelines of 2 stages cannot fill.
  refused(3, " --mode ddp --pp 2", "--mode ddp --pp 2: the 3 processes must split into groups of 2, but 3 is not a "
                                   "multiple of 2");
  // --mode ddp with a world of one pipeline: no replicas to synchronise BatchNorm over.
  refused(2, " --mode ddp --pp 2 --sync-bn", "--sync-bn synchronises BatchNorm statistics over the data-parallel "
                                             "ranks, and this run has none (pp=2 dp_replicate=1");
  // A preset and a degree that contradict it: one error naming both.
  refused(2, " --mode ddp --dp-shard 2", "--mode ddp replicates the model (--dp-replicate), but --dp-shard 2 asks "
                                         "for shards of it");
  // Degrees that do not multiply to the world: every factor named.
  refused(4, " --pp 2 --dp-shard 3", "the parallel degrees multiply to 6 (pp 2 x dp_replicate 1 x dp_shard 3 x tp 1) "
                                     "but WORLD_SIZE is 4");
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
