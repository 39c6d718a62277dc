// train_cifar10 --mode fsdp under loomrun, as users run it: real processes, real TCP.
// meson passes the launcher's and the trainer's paths in LOOMRUN and TRAIN_CIFAR10.
//
// The contract: from the same --init, --mode fsdp ends with --mode ddp's weights (the
// same arithmetic: bitwise), and its --save is the file a single-process run can load.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "nn/json.h"         // defines: json::parse
#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains

namespace fs = std::filesystem;
using namespace loom::testing;

namespace {

const std::string kArgs =
    " --model tiny --synthetic --batch-size 8 --eval-limit 50 --threads 1 --workers 0 --quiet";

Result train(const std::string& launcher_args, const std::string& args) {
  const std::string train = path_from_env("TRAIN_CIFAR10");
  const std::string command = launcher_args.empty()
                                  ? train + kArgs + args
                                  : path_from_env("LOOMRUN") + " --standalone " + launcher_args + " " + train + kArgs +
                                        args;
  return Launch(command).finish();
}

}  // namespace

TEST_CASE("--mode fsdp from the same --init equals --mode ddp after 2 steps; its --save loads in one process") {
  TempDir dir("loom_fsdp_launch");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = train("", " --max-steps 0 --save " + init);
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const std::string steps = " --max-steps 2 --init " + init;
  Result ddp = train("--nproc_per_node 2", " --mode ddp" + steps + " --save " + (dir.path / "ddp.safetensors").string() +
                                               " --metrics-json " + (dir.path / "ddp.json").string());
  REQUIRE_MESSAGE(ddp.code == 0, ddp.output);
  const std::string reference = read_file(dir.path / "ddp.safetensors");
  CHECK(reference.size() > 10000);
  // Both layouts: FSDP2's per-parameter shards (the default) and FSDP1's flat ones.
  for (const std::string layout : {"per_parameter", "flat"})
  for (const char* strategy : {"full_shard", "shard_grad_op", "no_shard"}) {
    CAPTURE(layout);
    CAPTURE(strategy);
    const std::string name = layout + "_" + strategy;
    const fs::path saved = dir.path / (name + ".safetensors");
    const fs::path metrics = dir.path / (name + ".json");
    Result fsdp = train("--nproc_per_node 2", std::string(" --mode fsdp --sharding-strategy ") + strategy +
                                                  " --fsdp-layout " + layout + steps + " --save " + saved.string() +
                                                  " --metrics-json " + metrics.string());
    REQUIRE_MESSAGE(fsdp.code == 0, fsdp.output);
    CHECK(read_file(saved) == reference);  // bitwise: the same names, order and values as DDP's file
    // Parameters + gradients + momentum after a step: half of DDP's when sharded over 2
    // ranks (padding: at most one element per unit, or per parameter's rows), all of it
    // under no_shard.
    const double mine = loom::json::parse(read_file(metrics))["model_state_mib"].as_double();
    const double ddp_mib = loom::json::parse(read_file(dir.path / "ddp.json"))["model_state_mib"].as_double();
    MESSAGE(std::string(strategy), ": model_state_mib ", mine, " (ddp: ", ddp_mib, ")");
    const double expected = std::string(strategy) == "no_shard" ? ddp_mib : ddp_mib / 2;
    CHECK(std::abs(mine - expected) <= 0.1 + 1e-9);  // the JSON rounds to 0.1 MiB
  }
  // A single-process run loads the FSDP file (strict: every key, no prefix) and evaluates it.
  Result eval = train("", " --eval-only --init " + (dir.path / "per_parameter_full_shard.safetensors").string());
  CHECK_MESSAGE(eval.code == 0, eval.output);
  CHECK_MESSAGE(contains(eval.output, "eval: test loss"), eval.output);
  // --tta under FSDP: each rank's share of the six views' logits, summed, is the whole test
  // set's (the line prints loss and accuracy to 4 and 2 decimals).
  const std::string tta = " --eval-only --tta mirror_translate --init " + init;
  Result tta_one = train("", tta), tta_fsdp = train("--nproc_per_node 2", " --dp-shard 2" + tta);
  REQUIRE_MESSAGE(tta_one.code == 0, tta_one.output);
  REQUIRE_MESSAGE(tta_fsdp.code == 0, tta_fsdp.output);
  const auto eval_line = [](const std::string& out) {
    const size_t at = out.find("eval: tta test loss");
    return at == std::string::npos ? std::string("(no eval line)") : out.substr(at, out.find('\n', at) - at);
  };
  CHECK(eval_line(tta_fsdp.output) == eval_line(tta_one.output));
  CHECK(eval_line(tta_one.output) != "(no eval line)");
}

TEST_CASE("--sharding-strategy hybrid_shard: 2 x 2 trains; a shard group size that does not divide the world is an error") {
  TempDir dir("loom_fsdp_hybrid");
  Result ok = train("--nproc_per_node 4", " --mode fsdp --sharding-strategy hybrid_shard --shard-group-size 2 "
                    "--max-steps 2 --save " + (dir.path / "w.safetensors").string());
  CHECK_MESSAGE(ok.code == 0, ok.output);
  Result bad = train("--nproc_per_node 4", " --mode fsdp --sharding-strategy hybrid_shard --shard-group-size 3 --max-steps 1");
  CHECK(bad.code != 0);
  CHECK_MESSAGE(contains(bad.output, "the shard group size (3) must divide the world size (4)"), bad.output);
  Result missing = train("--nproc_per_node 2", " --mode fsdp --sharding-strategy hybrid_shard --max-steps 1");
  CHECK(missing.code != 0);
  CHECK_MESSAGE(contains(missing.output, "needs --shard-group-size N"), missing.output);
}

TEST_CASE("--mode fsdp --checkpoint-dir then --resume continues bit for bit, from sharded and from full checkpoints") {
  TempDir dir("loom_fsdp_resume");
  const std::string fsdp = " --mode fsdp --sharding-strategy full_shard --seed 3";
  Result straight = train("--nproc_per_node 2", fsdp + " --max-steps 4 --save " + (dir.path / "a.safetensors").string());
  REQUIRE_MESSAGE(straight.code == 0, straight.output);
  const std::string a = read_file(dir.path / "a.safetensors");
  CHECK(a.size() > 10000);
  // sharded (the default under fsdp): a file per rank, a manifest; full: the optimizer
  // state consolidated on rank 0, one file.
  for (const std::string format : {"", " --checkpoint-format full"}) {
    CAPTURE(format);
    const fs::path ckpt = dir.path / (format.empty() ? "sharded" : "full");
    Result part1 = train("--nproc_per_node 2", fsdp + format + " --max-steps 2 --checkpoint-dir " + ckpt.string() +
                                                   " --checkpoint-every 2");
    REQUIRE_MESSAGE(part1.code == 0, part1.output);
    if (format.empty()) {
      CHECK(fs::exists(ckpt / "step-00000002" / ".metadata"));
      CHECK(fs::exists(ckpt / "step-00000002" / "shard-0-of-2.safetensors"));
      CHECK(fs::exists(ckpt / "step-00000002" / "shard-1-of-2.safetensors"));
      CHECK(!fs::exists(ckpt / "checkpoint.safetensors"));
    } else {
      CHECK(fs::exists(ckpt / "checkpoint.safetensors"));
    }
    Result part2 = train("--nproc_per_node 2", fsdp + format + " --max-steps 4 --checkpoint-dir " + ckpt.string() +
                                                   " --resume --save " + (ckpt / "b.safetensors").string());
    REQUIRE_MESSAGE(part2.code == 0, part2.output);
    CHECK(a == read_file(ckpt / "b.safetensors"));
  }
  // A half-written newest set (no manifest) is skipped, named, and the one before it used.
  const std::string sharded = (dir.path / "sharded").string();
  REQUIRE(fs::exists(dir.path / "sharded" / "step-00000002" / ".metadata"));  // part2 kept it as the fallback
  fs::remove(dir.path / "sharded" / "step-00000004" / ".metadata");
  Result again = train("--nproc_per_node 2", fsdp + " --max-steps 4 --checkpoint-dir " + sharded + " --resume --save " +
                                                 (dir.path / "c.safetensors").string());
  REQUIRE_MESSAGE(again.code == 0, again.output);
  CHECK_MESSAGE(contains(again.output, "skipped incomplete sharded checkpoints: step-00000004 (no .metadata manifest"),
                again.output);
  CHECK_MESSAGE(contains(again.output, "resumed from " + sharded + "/step-00000002 (a sharded checkpoint) at epoch 1, step 2"),
                again.output);
  CHECK(a == read_file(dir.path / "c.safetensors"));
  // At another world size, strategy or in one process it reshards, and says from what
  // (tests/test_resharding_launch.cpp checks the weights of every such pair).
  Result wider = train("--nproc_per_node 3", fsdp + " --max-steps 6 --checkpoint-dir " + sharded + " --resume");
  CHECK_MESSAGE(wider.code == 0, wider.output);
  CHECK_MESSAGE(contains(wider.output, "resharded step 4 from pp=1 dp_replicate=1 dp_shard=2 tp=1 (world 2), FSDP2 per-parameter shards "
                                       "(2 files) into pp=1 dp_replicate=1 dp_shard=3 tp=1 (world 3), FSDP2 per-parameter "
                                       "shards"),
                wider.output);
  Result other = train("--nproc_per_node 2", " --mode fsdp --sharding-strategy no_shard --seed 3 --max-steps 8 "
                       "--checkpoint-dir " + sharded + " --resume");
  CHECK_MESSAGE(other.code == 0, other.output);
  Result single = train("", " --max-steps 10 --checkpoint-dir " + sharded + " --checkpoint-format sharded --resume");
  CHECK_MESSAGE(single.code == 0, single.output);
  CHECK_MESSAGE(contains(single.output, "into pp=1 dp_replicate=1 dp_shard=1 tp=1 (world 1)"), single.output);
}
