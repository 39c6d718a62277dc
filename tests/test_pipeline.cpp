// The pipeline (parallel/pipeline/pipeline.h) on CPU virtual devices, one thread per
// stage: the transparency contract (gradients, loss and SGD steps equal one device's on
// the whole batch) for GPipe and 1F1B, 2 and 3 stages, even and uneven micro-batches;
// the two schedules agree bit for bit, with and without checkpointed micro-batches (whose
// BatchNorm statistics and memory are checked too); and a failing stage is a clear
// error, not a hang.
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "cuda/device.h"  // defines: cuda::is_available
#include "autograd/ops.h"
#include "core/allocator.h"  // defines: memory_stats, get_allocator
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
    int64_t n_microbatches, batch;
  };
  const std::vector<Case> cases = {{{"cpu:0", "cpu:1"}, {2, 4}, 4, 8},
                                   {{"cpu:0", "cpu:1"}, {3, 3}, 3, 7},  // uneven micro-batches: 3, 3, 1
                                   {{"cpu:0", "cpu:1", "cpu:2"}, {2, 2, 2}, 4, 9},
                                   {{"cpu:0", "cpu:1", "cpu:2"}, {1, 2, 3}, 1, 5}};
  for (const Case& c : cases) {
    std::vector<std::vector<Tensor>> grads_by_schedule;
    for (const std::string schedule : {"gpipe", "1f1b"})
    for (const std::string checkpoint : {"never", "except_last", "always"}) {
      CAPTURE(schedule);
      CAPTURE(checkpoint);
      CAPTURE(c.devices.size());
      CAPTURE(c.n_microbatches);
      CAPTURE(c.batch);
      manual_seed(7);
      auto single = small_net();
      auto staged = small_net();
      staged->load_state_dict(single->state_dict());
      Pipeline pipe(staged, c.devices, c.balance, c.n_microbatches, schedule, loss_of, checkpoint);
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
    // Note [Stages wait only for what they need]: both schedules accumulate in order;
    // Note [Checkpointed micro-batches are recomputed exactly]: with or without checkpoints.
    REQUIRE(grads_by_schedule.size() == 6);
    for (size_t k = 1; k < grads_by_schedule.size(); ++k)
      for (size_t i = 0; i < grads_by_schedule[0].size(); ++i)
        CHECK(grads_by_schedule[0][i].tolist<double>() == grads_by_schedule[k][i].tolist<double>());
  }
}

// small_net with a BatchNorm2d after each convolution: buffers that every forward updates.
std::shared_ptr<nn::Sequential> batch_norm_net() {
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 6, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(6), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(6, 8, 3, 2, 1), std::make_shared<nn::BatchNorm2d>(8), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Flatten>(1), std::make_shared<nn::Linear>(8 * 4 * 4, 10)});
  net->to(kFloat64);
  return net;
}

TEST_CASE("checkpointing recomputes exactly: 'always' and 'except_last' give 'never''s gradients and BatchNorm buffers") {
  struct Case {
    std::vector<Device> devices;
    std::vector<int64_t> balance;
  };
  for (const Case& c : {Case{{"cpu:0", "cpu:1"}, {4, 4}}, Case{{"cpu:0", "cpu:1", "cpu:2"}, {2, 3, 3}}})
  for (const std::string schedule : {"gpipe", "1f1b"})
  for (const std::string checkpoint : {"except_last", "always"}) {
    CAPTURE(c.devices.size());
    CAPTURE(schedule);
    CAPTURE(checkpoint);
    manual_seed(3);
    auto plain_net = batch_norm_net(), checkpointed_net = batch_norm_net();
    checkpointed_net->load_state_dict(plain_net->state_dict());
    Pipeline plain(plain_net, c.devices, c.balance, 3, schedule, loss_of, "never");
    Pipeline checkpointed(checkpointed_net, c.devices, c.balance, 3, schedule, loss_of, checkpoint);
    optim::SGD opt_plain(plain.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_checkpointed(checkpointed.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 2; ++step) {
      Tensor images = randn({7, 3, 8, 8}, kFloat64), labels = randint(0, 10, {7});  // micro-batches 3, 3, 1
      opt_plain.zero_grad();
      opt_checkpointed.zero_grad();
      auto want = plain.step(images, labels), got = checkpointed.step(images, labels);
      CHECK(got.loss.item<double>() == want.loss.item<double>());
      CHECK(max_abs_diff(got.output.to(Device("cpu:0")), want.output.to(Device("cpu:0"))) == 0);
      auto gw = grads_of(*plain_net), gc = grads_of(*checkpointed_net);
      for (size_t i = 0; i < gw.size(); ++i) CHECK(gw[i].tolist<double>() == gc[i].tolist<double>());
      opt_plain.step();
      opt_checkpointed.step();
    }
    // Running statistics and num_batches_tracked: updated once per micro-batch forward,
    // not again by the recomputation.
    auto bw = plain_net->state_dict(), bc = checkpointed_net->state_dict();
    for (const auto& [key, tensor] : bw) {
      const std::string& name = key;  // See Note [doctest messages name no structured binding]
      CAPTURE(name);
      CHECK(max_abs_diff(tensor.to(Device("cpu:0")), bc.find(name)->to(Device("cpu:0"))) == 0);
    }
  }
}

TEST_CASE("checkpointing frees each stage's activations: the step's peak memory falls") {
  // Activations dominate: 4 Linear(512, 512) + ReLU per stage on micro-batches of 256
  // float64 rows (1 MiB per activation), against 2 MiB of weights per Linear.
  std::vector<std::shared_ptr<nn::Module>> layers;
  for (int i = 0; i < 8; ++i) {
    layers.push_back(std::make_shared<nn::Linear>(512, 512));
    layers.push_back(std::make_shared<nn::ReLU>());
  }
  auto net = std::make_shared<nn::Sequential>(layers);
  net->to(kFloat64);
  auto mse = [](const Tensor& out, const Tensor& target) { return (out - target).pow(2.0).mean(); };
  Tensor images = randn({2048, 512}, kFloat64), target = randn({2048, 512}, kFloat64);
  auto peak_of = [&](const std::string& checkpoint) {
    Pipeline pipe(net, {"cpu:0", "cpu:1"}, {8, 8}, 8, "gpipe", mse, checkpoint);
    pipe.zero_grad();
    pipe.step(images, target);  // warm-up: gradients and the allocator's blocks exist
    pipe.zero_grad(/*set_to_none=*/false);
    const int64_t before = memory_stats(Device("cpu")).allocated_bytes;
    get_allocator(DeviceType::CPU)->reset_peak_stats(Device("cpu"));
    pipe.step(images, target);
    return memory_stats(Device("cpu")).peak_allocated_bytes - before;
  };
  const int64_t never = peak_of("never"), except_last = peak_of("except_last"), always = peak_of("always");
  MESSAGE("peak step memory above the model's: never ", never >> 20, " MiB, except_last ", except_last >> 20,
          " MiB, always ", always >> 20, " MiB");
  CHECK(except_last < never * 3 / 5);  // cpu:0's (stage 0's) peaks, measured: 41, 13 and 9 MiB
  CHECK(always < never / 2);
  CHECK(always <= except_last);
}

// A layer that draws from the default generator without being a Dropout.
struct Noise : nn::Cloneable<Noise> {
  Noise() : Cloneable("Noise") {}
  void reset() override {}
  Tensor forward(const Tensor& x) override { return x + randn(x.shape(), TensorOptions(x.dtype())) * 0.1; }
};

TEST_CASE("checkpointing refuses what it cannot recompute exactly: dropout, any random draw; and unknown names") {
  Tensor x = randn({4, 4}, kFloat64), y = randint(0, 3, {4});
  auto with = [](std::shared_ptr<nn::Module> middle) {
    auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(4, 4), std::move(middle), std::make_shared<nn::Linear>(4, 3)});
    net->to(kFloat64);
    return net;
  };
  // A Dropout draws another mask when recomputed, whatever generator it uses: refused
  // before the step changes anything.
  Generator own(5);
  auto dropout_net = with(std::make_shared<nn::Dropout>(0.5, &own));
  Pipeline never(dropout_net, {"cpu:0", "cpu:1"}, {2, 1}, 2, "1f1b", loss_of, "never");
  CHECK(std::isfinite(never.step(x, y).loss.item<double>()));
  never.zero_grad();
  Pipeline always(dropout_net, {"cpu:0", "cpu:1"}, {2, 1}, 2, "1f1b", loss_of, "always");
  CHECK_THROWS_WITH_AS(always.step(x, y), doctest::Contains("stage 0 has a Dropout in training mode ('1': Dropout(p=0.5)"), Error);
  for (const Tensor& p : dropout_net->parameters()) CHECK_FALSE(p.grad().defined());
  dropout_net->eval();  // no masks in eval mode: nothing random to recompute
  CHECK(std::isfinite(always.step(x, y).loss.item<double>()));
  // Any other draw from the default generator during a checkpointed step is caught after it.
  Pipeline noisy(with(std::make_shared<Noise>()), {"cpu:0", "cpu:1"}, {2, 1}, 2, "gpipe", loss_of, "except_last");
  CHECK_THROWS_WITH_AS(noisy.step(x, y),
                       doctest::Contains("drew random numbers during a step with checkpoint='except_last'"), Error);
  CHECK_THROWS_WITH_AS(Pipeline(dropout_net, {"cpu:0", "cpu:1"}, {2, 1}, 2, "1f1b", loss_of, "sometimes"),
                       doctest::Contains("checkpoint must be 'never', 'except_last' or 'always'"), Error);
  CHECK(always.str().find("checkpoint=always") != std::string::npos);
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
                       doctest::Contains("expected gpipe, 1f1b or interleaved_1f1b"), Error);
  CHECK_THROWS_WITH_AS(Pipeline(net, {"cpu:0"}, {2, 4}, 2, "1f1b", loss_of),
                       doctest::Contains("Pipeline: 2 stages in the balance but 1 devices"), Error);
  CHECK(pipe.str().rfind("Pipeline(", 0) == 0);
  CHECK_THROWS_WITH_AS(pipe.step(randn({4, 3, 8, 8}, kFloat64), randint(0, 10, {3})),
                       doctest::Contains("the same positive batch size"), Error);
  for (double bad_scale : {0.0, -1.0, std::nan(""), double(INFINITY)})
    CHECK_THROWS_WITH_AS(pipe.step(randn({4, 3, 8, 8}, kFloat64), randint(0, 10, {4}), bad_scale),
                         doctest::Contains("loss_scale must be a positive finite number"), Error);
  NoGradGuard no_grad;
  CHECK_THROWS_WITH_AS(pipe.step(randn({4, 3, 8, 8}, kFloat64), randint(0, 10, {4})),
                       doctest::Contains("needs grad mode on"), Error);
}

TEST_CASE("interleaved 1F1B: S×V virtual stages on S devices give one device's gradients and GPipe's bit for bit") {
  struct Case {
    std::vector<Device> devices;
    std::vector<int64_t> balance;  // S×V entries
    int64_t n_microbatches, batch;
  };
  const std::vector<Case> cases = {{{"cpu:0", "cpu:1"}, {1, 2, 1, 2}, 4, 8},
                                   {{"cpu:0", "cpu:1"}, {2, 1, 1, 2}, 3, 7},  // micro-batches 3, 3, 1
                                   {{"cpu:0", "cpu:1", "cpu:2"}, {1, 1, 1, 1, 1, 1}, 5, 10},
                                   {{"cpu:0", "cpu:1", "cpu:2"}, {1, 1, 1, 1, 1, 1}, 2, 4}};
  for (const Case& c : cases) {
    CAPTURE(c.devices.size());
    CAPTURE(c.n_microbatches);
    manual_seed(11);
    auto single = small_net(), interleaved_net = small_net(), gpipe_net = small_net();
    interleaved_net->load_state_dict(single->state_dict());
    gpipe_net->load_state_dict(single->state_dict());
    Pipeline interleaved(interleaved_net, c.devices, c.balance, c.n_microbatches, "interleaved_1f1b", loss_of);
    CHECK(interleaved.virtual_stages() == 2);
    CHECK(interleaved.stages().size() == 2 * c.devices.size());
    // Virtual stage k on devices[k % S]: the same layers GPipe runs on S·V devices.
    std::vector<Device> all;
    for (size_t k = 0; k < c.balance.size(); ++k) all.push_back(Device(DeviceType::CPU, int(k)));
    Pipeline gpipe(gpipe_net, all, c.balance, c.n_microbatches, "gpipe", loss_of);
    for (size_t k = 0; k < c.balance.size(); ++k)
      CHECK(interleaved.devices()[k] == c.devices[k % c.devices.size()]);
    optim::SGD opt_single(single->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_interleaved(interleaved.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::SGD opt_gpipe(gpipe.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 2; ++step) {
      Tensor images = randn({c.batch, 3, 8, 8}, kFloat64), labels = randint(0, 10, {c.batch});
      opt_single.zero_grad();
      opt_interleaved.zero_grad();
      opt_gpipe.zero_grad();
      Tensor out = (*single)(images);
      Tensor loss = loss_of(out, labels);
      loss.backward();
      auto result = interleaved.step(images, labels);
      auto reference = gpipe.step(images, labels);
      CHECK(result.loss.item<double>() == reference.loss.item<double>());
      CHECK(result.loss.item<double>() == doctest::Approx(loss.item<double>()).epsilon(1e-12));
      auto want = grads_of(*single), got = grads_of(*interleaved_net), same = grads_of(*gpipe_net);
      for (size_t i = 0; i < want.size(); ++i) {
        CHECK(max_abs_diff(want[i], got[i]) < 1e-12);
        CHECK(got[i].tolist<double>() == same[i].tolist<double>());
      }
      opt_single.step();
      opt_interleaved.step();
      opt_gpipe.step();
    }
  }
  auto net = small_net();
  CHECK_THROWS_WITH_AS(Pipeline(net, {"cpu:0", "cpu:1"}, {2, 2, 2}, 2, "interleaved_1f1b", loss_of),
                       doctest::Contains("interleaved_1f1b needs S×V entries in the balance (V virtual stages on each of "
                                         "the 2 devices), got 3"), Error);
  CHECK_THROWS_WITH_AS(Pipeline(net, {"cpu:0", "cpu:1"}, {1, 1, 1, 1}, 2, "interleaved_1f1b", loss_of),
                       doctest::Contains("the balance covers 4 layers, but the Sequential has 6"), Error);
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
