// train_cifar10 --mode ddp --pp P under loomrun: pipelines of processes side by side, each
// stage data-parallel over its replicas (examples/train/parallelize.cpp, apply_ddp_to_stage).
// With one micro-batch per batch a pipeline computes exactly what one process computes,
// so P x D processes must save what --mode ddp on D processes saves from the same --init.
#include <doctest/doctest.h>

#include <string>

#include "core/tensor.h"
#include "nn/safetensors.h"   // defines: load_file
#include "process_launch.h"   // defines: Launch, Result, TempDir, path_from_env, contains

using namespace loom;
using namespace loom::testing;

namespace {

// The tiny ResNet's Sequential has 10 layers. Shuffled, augmented data: the replicas'
// DistributedSampler shards must be DDP's.
const std::string kCommon = " --model tiny --synthetic --max-steps 2 --batch-size 8 --eval-limit 40 --threads 1 "
                            "--workers 0 --quiet";

std::string progress_line(const std::string& out) {
  const auto start = out.find("epoch 1/");
  return start == std::string::npos ? out : out.substr(start, out.find(" time", start) - start);
}

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
  auto a = safetensors::load_file(want), b = safetensors::load_file(got);
  REQUIRE(a.size() == b.size());
  for (const auto& [key, tensor] : a) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    CAPTURE(name);
    REQUIRE(b.find(name) != nullptr);
    CHECK(tensor.to(kFloat64).tolist<double>() == b.find(name)->to(kFloat64).tolist<double>());
  }
}

TEST_CASE("--mode ddp --pp: a world that pipelines of P stages cannot fill is refused, naming both") {
  TempDir dir("loom_pipeline_ddp_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  Result r = Launch(loomrun + " --standalone --nproc_per_node 3 " + train + kCommon + " --mode ddp --pp 2").finish();
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, "--mode ddp --pp 2: the 3 processes must form pipelines of 2 stages each"),
                r.output);
  Result sync = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + kCommon + " --mode ddp --pp 2 "
                       "--sync-bn").finish();
  CHECK(sync.code != 0);
  CHECK_MESSAGE(contains(sync.output, "--sync-bn with --pp 2"), sync.output);
}
