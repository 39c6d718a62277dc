// train_cifar10 --estimate-memory (train/estimate_memory.h): shape-only runs skip
// every computing kernel and keep every allocation (Note [Shape-only runs]); the predicted peak of
// each rank is within 10% of what training measures (max_memory_allocated, as the
// trainer's "memory per rank" line prints it) in one process, under DDP, FSDP and a
// pipeline over processes; and an out-of-memory error in the first steps names the
// strategies that would fit, on one rank and on two (without a hang), each estimated in the
// failing process with the figures a run of processes gives.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"      // defines: sum (a loss to run backward from)
#include "core/factory.h"      // defines: ones, zeros, randn
#include "core/memory.h"       // defines: max_memory_allocated
#include "core/shape_only.h"   // defines: ShapeOnlyGuard
#include "nn/resnet.h"         // defines: resnet_tiny
#include "process_launch.h"    // defines: Launch, Result, path_from_env, contains, under_loomrun
#include "train/memory_advice.h"  // defines: memory_advice (ranks as threads of this process)

using namespace loom;
using namespace loom::testing;

namespace {

// One forward and backward of the tiny ResNet on `device`; its peak there.
int64_t step_peak(Device device) {
  auto model = nn::resnet_tiny();
  model->to(device);
  Tensor x = randn({8, 3, 32, 32}, TensorOptions().device(device));
  sum((*model)(x)).backward();
  return max_memory_allocated(device);
}

// Tiny ResNet, synthetic data, one thread: seconds per run. On cpu:1, as a budget is best
// used: the data and the kernels' own workspace (on cpu) stay out of its figures.
const std::string kCommon = " --model tiny --synthetic --batch-size 32 --threads 1 --workers 0 --quiet --device cpu:1";

std::string train_cifar10(int ranks, const std::string& flags) {
  const std::string program = path_from_env("TRAIN_CIFAR10") + kCommon + " " + flags;
  return ranks == 1 ? program : under_loomrun(ranks, program);
}

// The number after `key` on the line that starts (after spaces) with `line_start`.
double number_after(const std::string& out, const std::string& line_start, const std::string& key) {
  const size_t line = out.find(line_start);
  REQUIRE_MESSAGE(line != std::string::npos, ("no '" + line_start + "' in:\n" + out));
  const size_t at = out.find(key, line);
  REQUIRE_MESSAGE(at != std::string::npos, ("no '" + key + "' after '" + line_start + "' in:\n" + out));
  return std::stod(out.substr(at + key.size()));
}

struct Comparison {
  std::vector<double> estimated, measured;  // MiB per rank
};

// The estimate of `flags` on `ranks` ranks beside the peak three training steps measure.
Comparison estimate_and_train(int ranks, const std::string& flags) {
  Result estimate = Launch(train_cifar10(ranks, flags + " --estimate-memory")).finish();
  REQUIRE_MESSAGE(estimate.code == 0, estimate.output);
  CHECK_MESSAGE(!contains(estimate.output, "epoch 1/"), ("--estimate-memory trained:\n" + estimate.output));
  Result trained = Launch(train_cifar10(ranks, flags + " --max-steps 3 --eval-limit 0")).finish();
  REQUIRE_MESSAGE(trained.code == 0, trained.output);
  Comparison c;
  for (int r = 0; r < ranks; ++r) {
    const std::string rank = "rank " + std::to_string(r);
    // Under loomrun a line per rank; in one process a line per device.
    c.estimated.push_back(number_after(estimate.output, "  " + (ranks == 1 ? "cpu:1" : rank) + ": peak", ": peak "));
    c.measured.push_back(number_after(trained.output, "memory per rank", rank + " peak "));
    MESSAGE((flags + " " + rank + ": estimated " + std::to_string(c.estimated.back()) + " MiB, measured " +
             std::to_string(c.measured.back()) + " MiB"));
  }
  return c;
}

void check_within_10_percent(const Comparison& c) {
  for (size_t r = 0; r < c.measured.size(); ++r)
    CHECK(std::abs(c.estimated[r] - c.measured[r]) <= 0.10 * c.measured[r]);
}

}  // namespace

TEST_CASE("shape-only: no computing kernel writes a byte, copies still do, and a training step allocates exactly as "
          "a real one") {
  Tensor x = ones({4, 4}), copied = zeros({4, 4});
  {
    ShapeOnlyGuard guard;
    CHECK(shape_only());
    x.mul_(7);
    x.add_(x);
    Tensor y = x + x;
    CHECK(y.shape() == Shape{4, 4});  // the output exists, with its shape...
    copied.copy_(x);                  // (bytes move: metadata travels through copies)
  }
  CHECK_FALSE(shape_only());
  CHECK(x.tolist<float>() == std::vector<float>(16, 1.0f));  // ...but nothing computed into x
  CHECK(copied.tolist<float>() == std::vector<float>(16, 1.0f));
  // A device of each (virtual, so their counts start at zero): the same peak to the byte.
  const int64_t real = step_peak(Device("cpu:5"));
  int64_t skipped = 0;
  {
    ShapeOnlyGuard guard;
    skipped = step_peak(Device("cpu:6"));
  }
  CHECK(real > 0);
  CHECK(skipped == real);
}

TEST_CASE("--estimate-memory: each rank's predicted peak is within 10% of the measured max_memory_allocated") {
  SUBCASE("one process") { check_within_10_percent(estimate_and_train(1, "")); }
  SUBCASE("DDP, 2 ranks") { check_within_10_percent(estimate_and_train(2, "--mode ddp")); }
  SUBCASE("FSDP full_shard, 2 ranks") { check_within_10_percent(estimate_and_train(2, "--mode fsdp")); }
  SUBCASE("pipeline over 2 processes") { check_within_10_percent(estimate_and_train(2, "--pp 2 --microbatches 4")); }
}

TEST_CASE("--estimate-memory in one process over several devices prints one line per device") {
  Result r = Launch(train_cifar10(1, "--mode pipeline --mp-devices 2 --estimate-memory --device-memory-limit 1GiB"))
                 .finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "  cpu:1: peak "), r.output);
  CHECK_MESSAGE(contains(r.output, "  cpu:2: peak "), r.output);
  CHECK_MESSAGE(contains(r.output, "--device-memory-limit 1GiB (1.00 GiB): fits"), r.output);
}

TEST_CASE("an out-of-memory error in the first steps lists the strategies that would fit") {
  // A budget at 80% of the single process's predicted peak: over it, but half the batch fits.
  Result estimate = Launch(train_cifar10(1, "--estimate-memory")).finish();
  REQUIRE_MESSAGE(estimate.code == 0, estimate.output);
  const double peak = number_after(estimate.output, "  cpu:1: peak", ": peak ");
  const std::string limit = " --device-memory-limit " + std::to_string(static_cast<int64_t>(peak * 0.8 * 1024)) + "KiB";

  SUBCASE("one process") {
    Result r = Launch(train_cifar10(1, "--max-steps 2" + limit)).finish();
    CHECK(r.code != 0);
    CHECK_MESSAGE(contains(r.output, "CPU out of memory. Tried to allocate"), r.output);
    CHECK_MESSAGE(contains(r.output, "Predicted peak per rank of the alternatives"), r.output);
    CHECK_MESSAGE(contains(r.output, "too large  --mode fsdp --sharding-strategy full_shard"), r.output);
    CHECK_MESSAGE(contains(r.output, "fits       --batch-size 16"), r.output);
  }
  SUBCASE("DDP, 2 ranks: one rank advises, the other stops with a line, nothing hangs") {
    Result r = Launch(train_cifar10(2, "--mode ddp --max-steps 2" + limit)).finish();
    CHECK(r.code != 0);
    CHECK_MESSAGE(contains(r.output, "Predicted peak per rank of the alternatives"), r.output);
    CHECK_MESSAGE(contains(r.output, "loomrun: worker rank"), r.output);
    CHECK(r.seconds < 120);
  }
  SUBCASE("a pipeline in one process: a stage's error is still an out-of-memory error") {
    Result r = Launch(train_cifar10(1, "--mode pipeline --max-steps 2 --device-memory-limit 3MiB")).finish();
    CHECK(r.code != 0);
    CHECK_MESSAGE(contains(r.output, "Pipeline: stage 0 (cpu:1) failed"), r.output);
    CHECK_MESSAGE(contains(r.output, "Predicted peak per rank of the alternatives"), r.output);
  }
}

// The numbers after `key` on the advice's line for `flags` ("rank peaks 12.6, 12.6 MiB").
static std::vector<double> advised_peaks(const std::string& advice, const std::string& flags, const std::string& key) {
  const size_t line = advice.find(flags + " ");
  REQUIRE_MESSAGE(line != std::string::npos, ("no '" + flags + "' in:\n" + advice));
  const size_t end = advice.find('\n', line);
  std::string rest = advice.substr(line, end == std::string::npos ? std::string::npos : end - line);
  const size_t at = rest.find(key);
  REQUIRE_MESSAGE(at != std::string::npos, ("no '" + key + "' on: " + rest));
  rest = rest.substr(at + key.size());
  std::vector<double> out;
  for (size_t pos = 0; pos < rest.size();) {
    size_t used = 0;
    out.push_back(std::stod(rest.substr(pos), &used));
    pos = rest.find(',', pos + used);
    if (pos == std::string::npos) break;
    ++pos;
  }
  return out;
}

TEST_CASE("the advice estimates each alternative in this process, with the figures a run of processes gives") {
  // The advice's alternatives run as threads here (Note [Advice after an out-of-memory
  // error]); each is compared with train_cifar10 --estimate-memory under loomrun (or alone).
  training::TrainConfig config;
  config.model.name = "tiny";
  config.data.synthetic = true;
  config.data.batch_size = 32;
  config.data.workers = 0;
  config.training.threads = 1;
  config.training.device = "cpu:1";
  config.metrics.progress = false;
  const std::string advice = training::memory_advice(config, 1);
  INFO(advice);
  const struct {
    std::string flags;
    int ranks;
    std::string key;
  } cases[] = {{"--mode ddp", 2, "rank peaks"},
               {"--mode ddp --zero-redundancy-optimizer", 2, "rank peaks"},
               {"--mode fsdp --sharding-strategy full_shard", 2, "rank peaks"},
               {"--pp 2", 2, "rank peaks"},
               {"--batch-size 16", 1, "peak"}};
  for (const auto& c : cases) {
    CAPTURE(c.flags);
    const std::vector<double> advised = advised_peaks(advice, c.flags, c.key);
    Result r = Launch(train_cifar10(c.ranks, c.flags + " --estimate-memory")).finish();
    REQUIRE_MESSAGE(r.code == 0, r.output);
    REQUIRE(static_cast<int>(advised.size()) == c.ranks);
    for (int rank = 0; rank < c.ranks; ++rank) {
      const double estimated =
          c.ranks == 1 ? number_after(r.output, "  cpu:1: peak", ": peak ")
                       : number_after(r.output, "  rank " + std::to_string(rank) + ": peak", ": peak ");
      CHECK_MESSAGE(std::abs(advised[static_cast<size_t>(rank)] - estimated) <= 0.02 * estimated + 0.1,
                    c.flags, " rank ", rank, ": advised ", advised[static_cast<size_t>(rank)], " MiB, estimated ",
                    estimated, " MiB under processes");
    }
  }
}
