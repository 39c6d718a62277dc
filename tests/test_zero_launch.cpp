// train_cifar10 --mode ddp --zero-redundancy-optimizer under loomrun, as users run it.
// meson passes the launcher's and the trainer's paths in LOOMRUN and TRAIN_CIFAR10.
//
// The contract: from the same --init, ZeRO-1 trains bit for bit like plain DDP (Note [Same
// arithmetic, same bits] in parallel/zero_redundancy_optimizer.h), so the saved weights
// and even the whole checkpoint (model, consolidated optimizer state, scheduler) are the
// same bytes; the weights load in a single-process run; a ZeRO-1 run resumes from a
// checkpoint exactly.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "nn/json.h"
#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::testing;

namespace {

const std::string kTrainArgs =
    " --model tiny --synthetic --batch-size 8 --eval-limit 16 --threads 1 --workers 0 --quiet --schedule cosine";

}  // namespace

TEST_CASE("--mode ddp --zero-redundancy-optimizer equals --mode ddp after 2 steps; weights load in one process") {
  TempDir dir("loom_zero_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const fs::path init = dir.path / "init.safetensors";
  Result made = Launch(train + kTrainArgs + " --seed 5 --max-steps 0 --save " + init.string()).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);

  auto run = [&](const std::string& name, const std::string& extra) {
    const fs::path out = dir.path / name;
    fs::create_directories(out);
    Result r = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + kTrainArgs + " --mode ddp --init " +
                      init.string() + " --max-steps 2 --save " + (out / "w.safetensors").string() +
                      " --checkpoint-dir " + (out / "ckpt").string() + " --metrics-json " +
                      (out / "m.json").string() + extra)
                   .finish();
    REQUIRE_MESSAGE(r.code == 0, r.output);
    return r;
  };
  Result ddp = run("ddp", "");
  Result zero = run("zero", " --zero-redundancy-optimizer --checkpoint-format full");
  // The default under ZeRO-1: every rank writes its own partition, nothing is gathered.
  Result zero_sharded = run("zero_sharded", " --zero-redundancy-optimizer");
  CHECK(fs::exists(dir.path / "zero_sharded" / "ckpt" / "step-00000002" / ".metadata"));
  CHECK(fs::exists(dir.path / "zero_sharded" / "ckpt" / "step-00000002" / "shard-1-of-2.safetensors"));
  CHECK(read_file(dir.path / "zero_sharded" / "w.safetensors") == read_file(dir.path / "ddp" / "w.safetensors"));
  const std::string weights = read_file(dir.path / "ddp" / "w.safetensors");
  CHECK(weights.size() > 10000);
  CHECK(weights == read_file(dir.path / "zero" / "w.safetensors"));  // bitwise
  // The checkpoint holds rank 0's consolidated optimizer state: the same bytes as DDP's.
  CHECK(read_file(dir.path / "ddp" / "ckpt" / "checkpoint.safetensors") ==
        read_file(dir.path / "zero" / "ckpt" / "checkpoint.safetensors"));

  // Memory: rank 0 prints every rank's figures; ZeRO-1 holds less optimizer state.
  for (const Result* r : {&ddp, &zero}) {
    CHECK_MESSAGE(contains(r->output, "memory per rank (MiB): rank 0 peak "), r->output);
    CHECK(contains(r->output, "; rank 1 peak "));
  }
  json::Value m_ddp = json::parse(read_file(dir.path / "ddp" / "m.json"));
  json::Value m_zero = json::parse(read_file(dir.path / "zero" / "m.json"));
  CHECK(m_zero["model_state_mib"].as_double() > 0);
  CHECK(m_zero["model_state_mib"].as_double() < m_ddp["model_state_mib"].as_double());
  CHECK(m_zero["train_loss"].as_double() == m_ddp["train_loss"].as_double());

  // The weights load in a plain single-process run.
  Result single = Launch(train + kTrainArgs + " --eval-only --init " + (dir.path / "zero" / "w.safetensors").string())
                      .finish();
  REQUIRE_MESSAGE(single.code == 0, single.output);
  CHECK_MESSAGE(contains(single.output, "eval: test loss"), single.output);

  // Resuming ZeRO-1 from the consolidated or the sharded checkpoint for 1 more step
  // equals resuming DDP.
  for (const char* name : {"ddp", "zero", "zero_sharded"}) {
    const fs::path out = dir.path / name;
    Result r = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + kTrainArgs + " --mode ddp --max-steps 3 " +
                      "--resume --checkpoint-dir " + (out / "ckpt").string() + " --save " +
                      (out / "w3.safetensors").string() +
                      (std::string(name) == "zero" ? " --zero-redundancy-optimizer --checkpoint-format full" : "") +
                      (std::string(name) == "zero_sharded" ? " --zero-redundancy-optimizer" : ""))
                   .finish();
    REQUIRE_MESSAGE(r.code == 0, r.output);
  }
  CHECK(read_file(dir.path / "ddp" / "w3.safetensors") == read_file(dir.path / "zero" / "w3.safetensors"));
  CHECK(read_file(dir.path / "ddp" / "w3.safetensors") == read_file(dir.path / "zero_sharded" / "w3.safetensors"));
}

TEST_CASE("--zero-redundancy-optimizer outside --mode ddp is a clear error") {
  Result r = Launch(path_from_env("TRAIN_CIFAR10") + kTrainArgs + " --max-steps 1 --zero-redundancy-optimizer").finish();
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, "--zero-redundancy-optimizer shards the optimizer state over DDP's ranks: it needs "
                                   "--mode ddp or --dp-replicate, got --mode single"), r.output);
}
