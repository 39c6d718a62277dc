// train_cifar10 --amp bf16 on the CPU in every parallel mode, as users run it (the
// multi-process ones under loomrun). meson passes the paths in LOOMRUN and TRAIN_CIFAR10.
//
// The contract (docs/mixed_precision.md): autocast lowers the convolutions and matrix
// products to bfloat16, but the parameters, their gradients and every reduction stay
// float32 (Note [Autocast conv2d weight gradients], autograd/ops/conv.cpp), so
//   - every mode trains under --amp bf16 and saves float32 weights;
//   - the transparency contracts of float32 hold unchanged: FSDP's weights equal DDP's and
//     a pipeline of processes equals the in-process pipeline, bit for bit;
//   - and autocast really ran: the bf16 weights differ from a float32 run's.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "core/cpu/bf16_path.h"  // defines: bf16_autocast_pays (what this CPU does under --amp bf16)
#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains, read_file

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::testing;

namespace {

const std::string kTrainArgs =
    " --model tiny --synthetic --batch-size 8 --eval-limit 16 --threads 1 --workers 0 --quiet --max-steps 2";

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("--amp bf16 trains in every mode with float32 weights; FSDP = DDP and --pp = in-process pipeline bitwise") {
  TempDir dir("loom_amp_modes_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const fs::path init = dir.path / "init.safetensors";
  Result made = Launch(train + kTrainArgs + " --seed 5 --max-steps 0 --save " + init.string()).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);

  // Runs one configuration from `init`; returns the saved weights' bytes.
  auto run = [&](const std::string& name, int processes, const std::string& args) {
    const fs::path weights = dir.path / (name + ".safetensors");
    const std::string command = (processes > 1 ? loomrun + " --standalone --nproc_per_node " +
                                                     std::to_string(processes) + " " : std::string()) +
                                train + kTrainArgs + " --init " + init.string() + " --save " + weights.string() + args;
    Result r = Launch(command).finish();
    CAPTURE(name);
    REQUIRE_MESSAGE(r.code == 0, r.output);
    if (contains(args, "--amp bf16")) {
      // Said once, by rank 0, whichever path this CPU takes.
      CHECK_MESSAGE(count_of(r.output, "--amp bf16 on the CPU: ") == 1, r.output);
    }
    const std::string bytes = read_file(weights);
    CHECK(contains(bytes, "\"dtype\":\"F32\""));
    CHECK_FALSE(contains(bytes, "\"dtype\":\"BF16\""));
    return bytes;
  };

  const std::string single = run("single", 1, " --mode single --amp bf16");
  run("dp", 1, " --mode dp --dp-devices 2 --amp bf16");
  const std::string pipeline = run("pipeline", 1, " --mode pipeline --mp-devices 2 --amp bf16");
  const std::string ddp = run("ddp", 2, " --mode ddp --amp bf16");
  const std::string fsdp = run("fsdp", 2, " --mode fsdp --sharding-strategy full_shard --amp bf16");
  const std::string pp = run("pp", 2, " --mode pipeline --pp 2 --amp bf16");
  run("pp_dp", 4, " --mode ddp --pp 2 --amp bf16");

  // Compared as flags: doctest would print the files' bytes.
  const bool fsdp_is_ddp = fsdp == ddp, pp_is_pipeline = pp == pipeline;
  CHECK(fsdp_is_ddp);      // FSDP's transparency under autocast: same casts, same float32 reductions
  CHECK(pp_is_pipeline);   // stages as processes = stages as threads, bf16 activations sent between them
  // Autocast ran: the same runs in float32 end elsewhere -- except on a CPU without bfloat16
  // arithmetic, where --amp bf16 runs float32 and says so (Note [bf16 autocast where the CPU
  // has no bfloat16 arithmetic]): there they end at the same bits.
  const bool float32_instead = !cpu::bf16_autocast_pays();
  const bool single_moved = run("single_f32", 1, " --mode single") != single;
  const bool ddp_moved = run("ddp_f32", 2, " --mode ddp") != ddp;
  CHECK(single_moved != float32_instead);
  CHECK(ddp_moved != float32_instead);
  Result said = Launch(path_from_env("TRAIN_CIFAR10") + kTrainArgs + " --mode single --amp bf16").finish();
  CHECK_MESSAGE(contains(said.output, "the step runs in float32") == float32_instead, said.output);
}

// Under float16 every rank holds part of the gradients in FSDP2, tp and pp, and the
// scaler's verdict on inf is reduced over the world (Note [One verdict on inf for every
// rank], parallel/sharded_grad_scaler.h): the compositions train, and FSDP2 = DDP bitwise.
TEST_CASE("--amp fp16 trains under FSDP2, FSDP2 x TP and pp x FSDP2; FSDP2 = DDP bitwise") {
  TempDir dir("loom_amp_fp16_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  auto run = [&](const std::string& name, int processes, const std::string& args) {
    const fs::path weights = dir.path / (name + ".safetensors");
    Result r = Launch(loomrun + " --standalone --nproc_per_node " + std::to_string(processes) + " " + train +
                      kTrainArgs + " --seed 5 --amp fp16 --save " + weights.string() + args)
                   .finish();
    CAPTURE(name);
    REQUIRE_MESSAGE(r.code == 0, r.output);
    return read_file(weights);
  };
  const std::string ddp = run("ddp", 2, " --mode ddp");
  const std::string fsdp2 = run("fsdp2", 2, " --mode fsdp --fsdp-layout per_parameter");
  const bool fsdp2_is_ddp = fsdp2 == ddp;
  CHECK(fsdp2_is_ddp);
  run("fsdp2_tp", 4, " --dp-shard 2 --tp 2 --fsdp-layout per_parameter");
  run("pp_fsdp2", 4, " --pp 2 --dp-shard 2 --fsdp-layout per_parameter");
}

TEST_CASE("--memory-format: auto is channels-last under --amp bf16 on the CPU, said once; a wrong value is named") {
  const std::string train = path_from_env("TRAIN_CIFAR10");
  const std::string args = train + kTrainArgs + " --seed 5 --mode single";
  Result automatic = Launch(args + " --amp bf16").finish();
  REQUIRE_MESSAGE(automatic.code == 0, automatic.output);
  CHECK_MESSAGE(contains(automatic.output, "; channels-last activations (--memory-format)"), automatic.output);
  Result nchw = Launch(args + " --amp bf16 --memory-format contiguous").finish();
  REQUIRE_MESSAGE(nchw.code == 0, nchw.output);
  CHECK_MESSAGE(contains(nchw.output, "; NCHW activations (--memory-format)"), nchw.output);
  Result float32_cl = Launch(args + " --memory-format channels_last").finish();  // float32 runs channels-last too
  CHECK_MESSAGE(float32_cl.code == 0, float32_cl.output);
  Result wrong = Launch(args + " --memory-format nhwc").finish();
  CHECK(wrong.code != 0);
  CHECK_MESSAGE(contains(wrong.output, "--memory-format: expected auto, contiguous or channels_last, got 'nhwc'"),
                wrong.output);
}
