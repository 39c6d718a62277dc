// The pipeline (parallel/pipeline/pipeline.h) on CPU virtual devices, one thread per
// stage: the transparency contract (gradients, loss and SGD steps equal one device's on
// the whole batch) for GPipe and 1F1B, 2 and 3 stages, even and uneven micro-batches;
// the two schedules agree bit for bit; and a failing stage is a clear error, not a hang.
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "cuda/device.h"  // defines: cuda::is_available
#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/pipeline/pipeline.h"
#include "rank_threads.h"  // defines: max_abs_diff
#include "transparency.h"  // defines: small_net

using namespace loom;
using loom::parallel::pipeline::Pipeline;
using loom::testing::max_abs_diff;
using loom::testing::small_net;

namespace {

Tensor loss_of(const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }

std::vector<Tensor> grads_of(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.grad().to(Device("cpu:0")));
  return out;
}

}  // namespace

TEST_CASE("transparency: GPipe and 1F1B give one device's gradients, loss and SGD steps on the whole batch") {
  struct Case {
    std::vector<Device> devices;
    std::vector<int64_t> balance;
    int64_t chunks, batch;
  };
  const std::vector<Case> cases = {{{"cpu:0", "cpu:1"}, {2, 4}, 4, 8},
                                   {{"cpu:0", "cpu:1"}, {3, 3}, 3, 7},  // uneven micro-batches: 3, 3, 1
                                   {{"cpu:0", "cpu:1", "cpu:2"}, {2, 2, 2}, 4, 9},
                                   {{"cpu:0", "cpu:1", "cpu:2"}, {1, 2, 3}, 1, 5}};
  for (const Case& c : cases) {
    std::vector<std::vector<Tensor>> grads_by_schedule;
    for (const std::string schedule : {"gpipe", "1f1b"}) {
      CAPTURE(schedule);
      CAPTURE(c.devices.size());
      CAPTURE(c.chunks);
      CAPTURE(c.batch);
      manual_seed(7);
      auto single = small_net();
      auto staged = small_net();
      staged->load_state_dict(single->state_dict());
      Pipeline pipe(staged, c.devices, c.balance, c.chunks, schedule, loss_of);
      optim::SGD opt_single(single->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
      optim::SGD opt_pipe(pipe.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
      for (int step = 0; step < 3; ++step) {
        Tensor images = randn({c.batch, 3, 8, 8}, kFloat64), labels = randint(0, 10, {c.batch});
        opt_single.zero_grad();
        opt_pipe.zero_grad();
        Tensor out = (*single)(images);
        Tensor loss = loss_of(out, labels);
        loss.backward();
        auto result = pipe.step(images, labels);
        CHECK(result.loss.item<double>() == doctest::Approx(loss.item<double>()).epsilon(1e-12));
        CHECK(max_abs_diff(result.output.to(Device("cpu:0")), out) < 1e-12);
        auto want = grads_of(*single), got = grads_of(*staged);
        REQUIRE(want.size() == got.size());
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, max_abs_diff(want[i], got[i]));
        CHECK(worst < 1e-12);
        if (step == 0) grads_by_schedule.push_back(got);
        opt_single.step();
        opt_pipe.step();
      }
      // The inherited forward (evaluation): the whole batch through the stages.
      NoGradGuard no_grad;
      Tensor x = randn({4, 3, 8, 8}, kFloat64);
      CHECK(max_abs_diff(pipe(x).to(Device("cpu:0")), (*single)(x)) < 1e-12);
    }
    // Note [Stages wait only for what they need]: both schedules accumulate in order.
    REQUIRE(grads_by_schedule.size() == 2);
    for (size_t i = 0; i < grads_by_schedule[0].size(); ++i)
      CHECK(grads_by_schedule[0][i].tolist<double>() == grads_by_schedule[1][i].tolist<double>());
  }
}

TEST_CASE("the stages run in the caller's autocast; loss_scale scales every micro-batch's gradient") {
  auto net = small_net();
  net->to(kFloat32);
  Pipeline pipe(net, {"cpu:0", "cpu:1"}, {2, 4}, 3, "1f1b", loss_of);
  Tensor images = randn({6, 3, 8, 8}), labels = randint(0, 10, {6});
  {
    autocast::Guard bf16(DeviceType::CPU, kBFloat16);  // Note [What a device thread inherits]
    auto result = pipe.step(images, labels);
    CHECK(result.output.dtype() == kBFloat16);  // both stages' matmuls and convolutions in 16 bits
  }
  pipe.zero_grad();
  pipe.step(images, labels);
  std::vector<Tensor> plain = grads_of(*net);
  pipe.zero_grad();
  auto scaled = pipe.step(images, labels, /*loss_scale=*/8.0);
  std::vector<Tensor> eight = grads_of(*net);
  for (size_t i = 0; i < plain.size(); ++i)
    CHECK(max_abs_diff(eight[i], plain[i] * 8.0) <= 1e-6 * (1 + max_abs_diff(plain[i] * 8.0, zeros_like(plain[i]))));
  CHECK(std::isfinite(scaled.loss.item<float>()));
}

TEST_CASE("a stage that throws: an error naming the stage, the micro-batch and the tick; no hang; reusable") {
  auto net = small_net();
  Pipeline pipe(net, {"cpu:0", "cpu:1"}, {2, 4}, 2, "1f1b", loss_of);
  // Labels out of range fail in stage 1's loss, on its thread, while stage 0 goes on.
  CHECK_THROWS_WITH_AS(pipe.step(randn({4, 3, 8, 8}, kFloat64), full({4}, 99, TensorOptions(kInt64))),
                       doctest::Contains("Pipeline: stage 1 (cpu:1) failed in the forward of micro-batch 0 (its action at tick 1"),
                       Error);
  auto result = pipe.step(randn({4, 3, 8, 8}, kFloat64), randint(0, 10, {4}));
  CHECK(std::isfinite(result.loss.item<double>()));
  CHECK_THROWS_WITH_AS(Pipeline(net, {"cpu:0", "cpu:1"}, {2, 4}, 2, "zero-bubble", loss_of),
                       doctest::Contains("expected gpipe or 1f1b"), Error);
  CHECK_THROWS_WITH_AS(Pipeline(net, {"cpu:0"}, {2, 4}, 2, "1f1b", loss_of),
                       doctest::Contains("Pipeline: 2 stages in the balance but 1 devices"), Error);
  CHECK(pipe.str().rfind("Pipeline(", 0) == 0);
  CHECK_THROWS_WITH_AS(pipe.step(randn({4, 3, 8, 8}, kFloat64), randint(0, 10, {3})),
                       doctest::Contains("the same positive batch size"), Error);
  NoGradGuard no_grad;
  CHECK_THROWS_WITH_AS(pipe.step(randn({4, 3, 8, 8}, kFloat64), randint(0, 10, {4})),
                       doctest::Contains("needs grad mode on"), Error);
}

// Stage 1 on the GPU: its thread makes cuda:0 current (DeviceScope), activations and
// gradients cross PCIe both ways. Skipped without a GPU (not run yet: no GPU lent).
TEST_CASE("a stage on the GPU: GPipe and 1F1B give the CPU's gradients" * doctest::skip(!cuda::is_available())) {
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    CAPTURE(schedule);
    auto single = small_net();
    auto staged = small_net();
    single->to(kFloat32);
    staged->to(kFloat32);
    staged->load_state_dict(single->state_dict());
    Pipeline pipe(staged, {"cpu:0", "cuda:0"}, {2, 4}, 3, schedule, loss_of);
    Tensor images = randn({7, 3, 8, 8}), labels = randint(0, 10, {7});
    Tensor loss = loss_of((*single)(images), labels);
    loss.backward();
    auto result = pipe.step(images, labels);
    CHECK(result.output.device() == Device("cuda:0"));
    CHECK(result.loss.to(Device("cpu")).item<float>() == doctest::Approx(loss.item<float>()).epsilon(1e-4));
    auto want = grads_of(*single), got = grads_of(*staged);
    for (size_t i = 0; i < want.size(); ++i) CHECK(max_abs_diff(want[i], got[i]) < 1e-4);
  }
}
