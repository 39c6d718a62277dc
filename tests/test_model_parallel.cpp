// Layer-wise model parallelism (parallel/model_parallel.h) on CPU virtual devices: the
// split and the transparency contract (ResNet's output,
// gradients and SGD steps equal one device's, BatchNorm included: every stage sees the
// whole batch).
#include <doctest/doctest.h>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/model_parallel.h"
#include "rank_threads.h"  // defines: max_abs_diff

using namespace loom;
using loom::parallel::ModelParallel;
using loom::testing::max_abs_diff;

TEST_CASE("split_module: stages share the layers; a balance that does not add up is an error") {
  auto seq = nn::resnet_tiny(10)->sequential();
  const auto n = static_cast<int64_t>(seq->size());
  auto stages = parallel::split_module(*seq, {3, n - 3});
  REQUIRE(stages.size() == 2);
  CHECK((*stages[0])[0].get() == (*seq)[0].get());
  CHECK((*stages[1])[0].get() == (*seq)[3].get());
  CHECK_THROWS_WITH_AS(parallel::split_module(*seq, {3, n}), doctest::Contains("the counts must add up"), Error);
  CHECK_THROWS_WITH_AS(ModelParallel(seq, {Device("cpu:0")}, {3, n - 3}), doctest::Contains("one device per stage"),
                       Error);
}

TEST_CASE("transparency: ModelParallel ResNet equals one device, BatchNorm included, on 2 and 3 stages") {
  for (const std::vector<Device>& devices : {std::vector<Device>{"cpu:0", "cpu:1"},
                                             std::vector<Device>{"cpu:0", "cpu:1", "cpu:2"}}) {
    CAPTURE(devices.size());
    auto single = nn::resnet_tiny(10);
    auto model = nn::resnet_tiny(10);
    model->load_state_dict(single->state_dict());
    auto seq = model->sequential();
    const auto n = static_cast<int64_t>(seq->size());
    std::vector<int64_t> balance(devices.size(), 1);
    balance.back() = n - static_cast<int64_t>(devices.size()) + 1;
    if (devices.size() == 2) balance = {5, n - 5};
    ModelParallel mp(seq, devices, balance);
    for (size_t k = 0; k < devices.size(); ++k)
      for (const Tensor& p : mp.stages()[k]->parameters()) CHECK(p.device() == devices[k]);
    optim::SGD opt_single(single->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
    optim::SGD opt_mp(mp.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
    for (int step = 0; step < 3; ++step) {
      Tensor images = randn({6, 3, 16, 16}), labels = randint(0, 10, {6});
      Tensor out = mp(images);
      CHECK(out.device() == devices.back());
      Tensor ref = (*single)(images);
      CHECK(max_abs_diff(out.to(Device("cpu:0")), ref) < 1e-6);
      opt_single.zero_grad();
      opt_mp.zero_grad();
      cross_entropy(ref, labels).backward();
      cross_entropy(out, labels.to(devices.back())).backward();
      auto a = single->parameters(), b = model->parameters();
      REQUIRE(a.size() == b.size());
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, max_abs_diff(a[i].grad(), b[i].grad().to(Device("cpu:0"))));
      CHECK(worst < 1e-5);
      opt_single.step();
      opt_mp.step();
    }
    auto sa = single->state_dict(), sb = model->state_dict();  // running statistics too
    double worst = 0;
    for (const auto& [name, t] : sa)
      worst = std::max(worst, max_abs_diff(t.to(kFloat64), sb[name].to(Device("cpu:0")).to(kFloat64)));
    CHECK(worst < 1e-5);
  }
}
