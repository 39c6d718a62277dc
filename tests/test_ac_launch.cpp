// train_cifar10 --activation-checkpoint: blocks recompute their activations in backward
// (Note [Activation checkpointing], nn/checkpoint.h). From the same --init, a run with
// every block (full) or every other block (selective) checkpointed saves the very weights
// of the run without, in one process and under each parallelism it composes with; and the
// step's peak memory is lower (peak_memory_mib of --metrics-json) where activations weigh:
// a recomputed block's output exists twice for a moment, so on a tiny model whose
// activations are a few MiB the peak can even grow.
#include <doctest/doctest.h>

#include <string>

#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains, under_loomrun, read_file
#include "saved_weights.h"   // defines: check_same_weights

using namespace loom;
using namespace loom::testing;

namespace {

const std::string kCommon = " --model tiny --synthetic --max-steps 3 --eval-limit 0 --threads 1 --workers 0 --quiet";

std::string train(int ranks, const std::string& flags) { return trainer_command(ranks, kCommon + " " + flags); }

std::string saved(const TempDir& dir, int ranks, const std::string& flags, const std::string& name) {
  return run_saving_weights(dir, train(ranks, flags), name);
}

double peak_mib(const TempDir& dir, const std::string& flags, const std::string& name) {
  const std::string metrics = (dir.path / (name + ".json")).string();
  Result r = Launch(train(1, flags + " --metrics-json " + metrics)).finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string text = read_file(metrics);
  const size_t at = text.find("\"peak_memory_mib\": ");
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(at + 19));
}

}  // namespace

TEST_CASE("--activation-checkpoint full and selective train bitwise as none: one process, DDP, FSDP, --pp, --tp") {
  TempDir dir("loom_ac");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(path_from_env("TRAIN_CIFAR10") + kCommon + " --max-steps 0 --save " + init).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  struct Run {
    int ranks;
    std::string flags, name;
  };
  const std::string batch16 = " --batch-size 16 --init " + init, batch8 = " --batch-size 8 --init " + init;
  for (const Run& run : {Run{1, batch16, "single"}, Run{2, batch8 + " --dp-replicate 2", "ddp"},
                         Run{2, batch8 + " --dp-shard 2", "fsdp"},
                         Run{2, batch16 + " --pp 2 --microbatches 2 --balance 5,5", "pp"},
                         Run{2, batch16 + " --tp 2", "tp"}}) {
    CAPTURE(run.name);
    const std::string none = saved(dir, run.ranks, run.flags, run.name + "_none");
    check_same_weights(none, saved(dir, run.ranks, run.flags + " --activation-checkpoint full", run.name + "_full"));
    if (run.ranks == 1)
      check_same_weights(none, saved(dir, 1, run.flags + " --activation-checkpoint selective --selective-ac-option 2",
                                     run.name + "_selective"));
  }
}

TEST_CASE("--activation-checkpoint lowers the peak memory of a step, and bad values are refused") {
  TempDir dir("loom_ac_peak");
  const std::string flags = " --model resnet18 --batch-size 64 --max-steps 1";  // activations well above the data
  const double none = peak_mib(dir, flags, "none"), full = peak_mib(dir, flags + " --activation-checkpoint full", "full");
  MESSAGE("resnet18, batch 64: peak ", none, " MiB without, ", full, " MiB with every block checkpointed");
  CHECK(full < none);
  Result bad = Launch(train(1, " --activation-checkpoint some")).finish();
  CHECK(bad.code != 0);
  CHECK_MESSAGE(contains(bad.output, "--activation-checkpoint: expected none, full or selective, got 'some'"),
                bad.output);
  Result zero = Launch(train(1, " --activation-checkpoint selective --selective-ac-option 0")).finish();
  CHECK(zero.code != 0);
  CHECK_MESSAGE(contains(zero.output, "--selective-ac-option: expected N >= 1"), zero.output);
}
