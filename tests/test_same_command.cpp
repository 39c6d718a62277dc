// Same command, same model (Note [Same command, same model], core/deterministic.h): on the
// programs' default flags, one command run twice trains byte-identical weights -- in one
// process, under DDP, FSDP, --tp 2 and --pp 2 x DDP, the second run of each beside a busy
// loop on every core (where a choice made by timing would come out differently) -- and the
// speedrun's first 30 steps, run twice, end with the same loss and accuracy to the last bit. With the
// kernel search switched back on by default (LOOM_CONV_BENCHMARK=on in this test's
// environment) these comparisons fail. --deterministic refuses what would break them.
#include <doctest/doctest.h>

#include <string>

#include "busy_cores.h"      // defines: run_idle_then_busy
#include "data/data_root.h"  // defines: find_cifar10_root (the speedrun's data, when present)
#include "nn/json.h"         // defines: json::parse (the speedrun's metrics)
#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, trainer_command, read_file

using namespace loom;
using namespace loom::testing;

namespace {

// A small model with several convolution shapes, each of which has several algorithms the
// kernel search could choose from; a few steps of synthetic data.
const std::string kFlags = "--model tiny --synthetic --max-steps 3 --batch-size 16 --eval-limit 32 --threads 1 "
                           "--workers 0 --quiet";

// `flags` on `ranks` processes twice, the second time beside a busy loop on every core: the
// bytes of both --save files.
std::pair<std::string, std::string> twice(const TempDir& dir, int ranks, const std::string& flags) {
  const std::string command = trainer_command(ranks, kFlags + " " + flags) + " --save ";
  const std::string first = (dir.path / "first.safetensors").string(), second = (dir.path / "second.safetensors").string();
  run_idle_then_busy(command + first, command + second);
  return {read_file(first), read_file(second)};
}

void check_same_bytes(int ranks, const std::string& flags) {
  TempDir dir("loom_same_command");
  const std::pair<std::string, std::string> saved = twice(dir, ranks, flags);
  REQUIRE(!saved.first.empty());
  const bool same = saved.first == saved.second;  // (doctest would print the files' bytes)
  CHECK_MESSAGE(same, "the same command saved different weights: ", flags);
}

}  // namespace

TEST_CASE("the same command twice trains byte-identical weights: one process, DDP, FSDP, --tp 2, --pp 2 x DDP") {
  SUBCASE("one process") { check_same_bytes(1, ""); }
  SUBCASE("DDP") { check_same_bytes(2, "--mode ddp"); }
  SUBCASE("FSDP") { check_same_bytes(2, "--dp-shard 2"); }
  SUBCASE("--tp 2") { check_same_bytes(2, "--tp 2"); }
  SUBCASE("--pp 2 x DDP") { check_same_bytes(4, "--mode ddp --pp 2 --microbatches 2"); }
}

TEST_CASE("the speedrun's first 30 steps, twice: the same loss and accuracy to the last bit") {
  try {
    (void)data::find_cifar10_root(std::nullopt);
  } catch (const std::exception& e) {
    MESSAGE("skipped: the speedrun trains on the real CIFAR-10, not found here (", e.what(), ")");
    return;
  }
  TempDir dir("loom_same_speedrun");
  const std::string command = path_from_env("AIRBENCH") + " --max-steps 30 --tta 0 --threads 2 --metrics-json ";
  const std::string first = (dir.path / "first.json").string(), second = (dir.path / "second.json").string();
  // Without the busy loops: two speedrun prefixes beside them would take minutes, and the
  // modes above already show that load changes nothing on the defaults.
  Result a = Launch(command + first).finish();
  REQUIRE_MESSAGE(a.code == 0, a.output);
  Result b = Launch(command + second).finish();
  REQUIRE_MESSAGE(b.code == 0, b.output);
  const json::Value x = json::parse(read_file(first)), y = json::parse(read_file(second));
  // The last step's loss is a function of every weight the 29 steps before it made; the
  // accuracy of the whole test set, of the final weights.
  for (const char* key : {"train_loss_last", "accuracy"}) {
    CAPTURE(key);
    REQUIRE(x.find(key) != nullptr);
    CHECK(x[key].as_double() == y[key].as_double());
  }
}

TEST_CASE("--deterministic refuses the kernel search and a pipeline cut by time, with the way out") {
  Result search = Launch(trainer_command(1, kFlags + " --deterministic --conv-benchmark on")).finish();
  CHECK(search.code == 1);
  CHECK_MESSAGE(contains(search.output, "--deterministic refuses --conv-benchmark on"), search.output);
  CHECK_MESSAGE(contains(search.output, "--conv-benchmark-cache FILE alone"), search.output);
  Result timed = Launch(trainer_command(2, kFlags + " --deterministic --pp 2 --balance time")).finish();
  CHECK(timed.code != 0);
  CHECK_MESSAGE(contains(timed.output, "--deterministic refuses --balance time"), timed.output);
  // On the defaults --deterministic changes nothing: the same bytes as without it.
  TempDir dir("loom_same_deterministic");
  const std::string with = (dir.path / "with.safetensors").string(), without = (dir.path / "without.safetensors").string();
  Result a = Launch(trainer_command(1, kFlags + " --deterministic --save " + with)).finish();
  REQUIRE_MESSAGE(a.code == 0, a.output);
  Result b = Launch(trainer_command(1, kFlags + " --save " + without)).finish();
  REQUIRE_MESSAGE(b.code == 0, b.output);
  CHECK(read_file(with) == read_file(without));
}
