// DataParallel (parallel/data_parallel.h) on CPU virtual devices: its four pieces
// (scatter, replicate, parallel_apply, gather), the transparency contract (gradients and
// trained weights equal single-device training on the same batch), BatchNorm's running
// statistics (kept from the first device's chunk, as PyTorch), and its errors.
#include <doctest/doctest.h>

#include <atomic>
#include <set>
#include <thread>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "cuda/device.h"  // defines: cuda::is_available
#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/data_parallel.h"
#include "gradcheck.h"     // defines: gradcheck
#include "rank_threads.h"  // defines: max_abs_diff
#include "transparency.h"  // defines: small_net, max_param_diff, max_grad_diff

using namespace loom;
using loom::parallel::DataParallel;
using loom::testing::max_abs_diff;
using loom::testing::max_grad_diff;
using loom::testing::max_param_diff;
using loom::testing::small_net;

namespace {

const std::vector<Device> kTwo = {Device("cpu:0"), Device("cpu:1")};
const std::vector<Device> kThree = {Device("cpu:0"), Device("cpu:1"), Device("cpu:2")};

}  // namespace

TEST_CASE("scatter: torch.chunk's pieces, one per device, fewer when the batch is smaller") {
  Tensor x = arange(0, 7, 1, TensorOptions(kFloat32)).view({7, 1});
  auto parts = parallel::scatter(x, kThree);
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].tolist<float>() == std::vector<float>{0, 1, 2});
  CHECK(parts[1].tolist<float>() == std::vector<float>{3, 4, 5});
  CHECK(parts[2].tolist<float>() == std::vector<float>{6});
  for (size_t i = 0; i < 3; ++i) CHECK(parts[i].device() == kThree[i]);
  auto two = parallel::scatter(arange(0, 2), kThree);
  REQUIRE(two.size() == 2);  // a batch of 2 uses 2 of the 3 devices
  CHECK(two[1].device() == Device("cpu:1"));
  CHECK_THROWS_WITH_AS(parallel::scatter(zeros({0, 3}), kTwo), doctest::Contains("at least one element"), Error);
}

TEST_CASE("scatter and gather are differentiable (finite differences, float64), along dim 0 and 1") {
  for (int64_t dim : {0, 1}) {
    CAPTURE(dim);
    Tensor x = randn({5, 4}, kFloat64).requires_grad_(true);
    loom::testing::gradcheck(
        [&](const std::vector<Tensor>& in) {
          auto parts = parallel::scatter(in[0], kThree, dim);
          for (size_t i = 0; i < parts.size(); ++i) parts[i] = parts[i] * double(i + 1);  // each piece its own way
          return parallel::gather(parts, Device("cpu:0"), dim);
        },
        {x});
  }
  Tensor y = parallel::gather({ones({2}), zeros({1}, TensorOptions().device("cpu:2"))}, Device("cpu:1"));
  CHECK(y.device() == Device("cpu:1"));
  CHECK(y.tolist<float>() == std::vector<float>{1, 1, 0});
}

TEST_CASE("replicate: copies on each device whose gradients sum into the module's parameters") {
  auto net = small_net();
  auto replicas = parallel::replicate(*net, {Device("cpu:1"), Device("cpu:2")});
  REQUIRE(replicas.size() == 2);
  auto originals = net->parameters();
  for (size_t r = 0; r < 2; ++r) {
    auto copies = replicas[r]->parameters();
    REQUIRE(copies.size() == originals.size());
    for (size_t i = 0; i < copies.size(); ++i) {
      CHECK(copies[i].device() == Device(DeviceType::CPU, int(r) + 1));
      CHECK_FALSE(copies[i].is_leaf());  // Note [Replica parameters are functions of the parameters]
      CHECK(max_abs_diff(copies[i], originals[i]) == 0);
    }
  }
  Tensor x1 = randn({2, 3, 8, 8}, TensorOptions(kFloat64).device("cpu:1"));
  Tensor x2 = randn({3, 3, 8, 8}, TensorOptions(kFloat64).device("cpu:2"));
  Tensor loss = sum((*replicas[0])(x1)).to(Device("cpu:0")) + sum((*replicas[1])(x2)).to(Device("cpu:0")) * 2.0;
  loss.backward();
  // The same sum through the module itself, on its own device.
  auto reference = small_net();
  reference->load_state_dict(net->state_dict());
  Tensor ref_loss = sum((*reference)(x1.to(Device("cpu:0")))) + sum((*reference)(x2.to(Device("cpu:0")))) * 2.0;
  ref_loss.backward();
  CHECK(max_grad_diff(*net, *reference) < 1e-12);
  // Under no_grad the replicas are plain copies: nothing is recorded.
  NoGradGuard no_grad;
  auto plain = parallel::replicate(*net, {Device("cpu:1")});
  for (const Tensor& p : plain[0]->parameters()) CHECK_FALSE(p.requires_grad());
}

TEST_CASE("transparency: DataParallel's gradients and SGD steps equal one device's on the same batch") {
  for (const auto& devices : {kTwo, kThree}) {
    for (int64_t batch : {12, 7}) {  // even and uneven chunks
      CAPTURE(devices.size());
      CAPTURE(batch);
      auto single = small_net();
      auto base = small_net();
      base->load_state_dict(single->state_dict());
      auto dp = std::make_shared<DataParallel>(base, devices);
      optim::SGD opt_single(single->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
      optim::SGD opt_dp(dp->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
      for (int step = 0; step < 3; ++step) {
        Tensor images = randn({batch, 3, 8, 8}, kFloat64), labels = randint(0, 10, {batch});
        Tensor out = (*dp)(images);
        CHECK(out.device() == Device("cpu:0"));
        CHECK(max_abs_diff(out, (*single)(images)) < 1e-12);
        opt_single.zero_grad();
        opt_dp.zero_grad();
        cross_entropy((*single)(images), labels).backward();
        cross_entropy(out, labels).backward();
        CHECK(max_grad_diff(*single, *base) < 1e-12);
        opt_single.step();
        opt_dp.step();
      }
      CHECK(max_param_diff(*single, *base) < 1e-12);
    }
  }
}

TEST_CASE("the replicas run on threads of their own, in the caller's grad mode and autocast") {
  // A module that records which thread ran it and whether grad mode was on there.
  struct Probe : nn::Cloneable<Probe> {
    Probe() : Cloneable("Probe") { reset(); }
    void reset() override { w = register_parameter("w", ones({1})); }
    Tensor forward(const Tensor& x) override {
      std::lock_guard<std::mutex> lock(*mutex);
      threads->insert(std::this_thread::get_id());
      grad_on->push_back(GradMode::is_enabled());
      return x * w;
    }
    Tensor w;
    std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
    std::shared_ptr<std::set<std::thread::id>> threads = std::make_shared<std::set<std::thread::id>>();
    std::shared_ptr<std::vector<bool>> grad_on = std::make_shared<std::vector<bool>>();
  };
  auto probe = std::make_shared<Probe>();
  DataParallel dp(probe, kThree);
  Tensor y = dp(ones({3, 2}));
  CHECK(probe->threads->size() == 3);
  CHECK(*probe->grad_on == std::vector<bool>{true, true, true});
  y.sum().backward();
  CHECK(probe->w.grad().tolist<float>() == std::vector<float>{6});  // every replica's x * w, summed
  dp(ones({3, 2}));
  CHECK(probe->threads->size() == 3);  // the same threads again: Note [Device threads persist]
  probe->grad_on->clear();
  NoGradGuard no_grad;
  Tensor z = dp(ones({3, 2}));
  CHECK(*probe->grad_on == std::vector<bool>{false, false, false});
  CHECK_FALSE(z.requires_grad());
  // Autocast is thread-local too (Note [Autocast state is per thread]): a matmul in every
  // replica runs in bfloat16 under the caller's scope, and in float32 outside it.
  auto linear = std::make_shared<nn::Linear>(4, 2);
  DataParallel dp_linear(linear, kThree);
  {
    autocast::Guard bf16(DeviceType::CPU, kBFloat16);
    CHECK(dp_linear(ones({3, 4})).dtype() == kBFloat16);
  }
  CHECK(dp_linear(ones({3, 4})).dtype() == kFloat32);
}

TEST_CASE("BatchNorm: the module's running statistics come from the first device's chunk, as PyTorch") {
  auto make = [] {
    auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Conv2d>(3, 4, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(4)});
    return net;
  };
  auto base = make(), reference = make();
  reference->load_state_dict(base->state_dict());
  DataParallel dp(base, kTwo);
  Tensor images = randn({6, 3, 5, 5});
  dp(images);
  (*reference)(images.narrow(0, 0, 3));  // what device 0's replica (the module itself) saw
  auto got = base->named_buffers(), want = reference->named_buffers();
  for (const auto& [key, t] : want) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    CAPTURE(name);
    CHECK(max_abs_diff(got[name].to(kFloat64), t.to(kFloat64)) < 1e-6);
  }
}

TEST_CASE("errors: the module off device_ids[0], devices listed twice or of two types, a failing replica, a null module") {
  auto net = small_net();
  CHECK_THROWS_WITH_AS(DataParallel(net, {Device("cpu:1"), Device("cpu:0")}),
                       doctest::Contains("must have its parameters and buffers on cpu:1 (device_ids[0]), but "
                                         "parameter \"0.weight\" is on cpu:0"),
                       Error);
  CHECK_THROWS_WITH_AS(DataParallel(net, {Device("cpu:0"), Device("cpu:0")}),
                       doctest::Contains("cpu:0 is listed twice"), Error);
  CHECK_THROWS_WITH_AS(DataParallel(net, {Device("cpu:0"), Device("cuda:0")}),
                       doctest::Contains("must all be of one type"), Error);
  DataParallel dp(net, kTwo);
  // A batch whose second chunk has the wrong shape for the net fails on that replica's
  // thread; the error names it.
  CHECK_THROWS_WITH_AS(dp(randn({4, 5, 8, 8}, kFloat64)), doctest::Contains("replica 0 (input on cpu:0) failed"),
                       Error);
  // Without device_ids and without CUDA, the module runs as is (as PyTorch).
  if (!cuda::is_available()) {
    DataParallel plain(net);
    CHECK(plain.device_ids().empty());
    CHECK(plain(randn({2, 3, 8, 8}, kFloat64)).shape() == Shape{2, 10});
  }
  CHECK(dp.named_parameters().keys().front() == "module.0.weight");  // PyTorch's state_dict keys
  CHECK_THROWS_WITH_AS(parallel::parallel_apply({net, nullptr}, {randn({1, 3, 8, 8}, kFloat64),
                                                                 randn({1, 3, 8, 8}, kFloat64)}),
                       doctest::Contains("parallel_apply: module 1 is null"), Error);
}

// replicate() onto the GPU from a CPU module: the replica's forward runs there, and its
// gradients come back across PCIe into the module's .grad(). Skipped without a GPU (not
// run yet: no GPU lent).
TEST_CASE("replicate onto the GPU: gradients come back to the CPU module" * doctest::skip(!cuda::is_available())) {
  auto net = small_net();
  net->to(kFloat32);
  auto reference = small_net();
  reference->to(kFloat32);
  reference->load_state_dict(net->state_dict());
  auto replicas = parallel::replicate(*net, {Device("cuda:0")});
  Tensor x = randn({4, 3, 8, 8});
  auto outputs = parallel::parallel_apply(replicas, {x.to(Device("cuda:0"))});
  parallel::gather(outputs, Device("cpu:0")).sum().backward();
  (*reference)(x).sum().backward();
  CHECK(max_grad_diff(*net, *reference) < 1e-4);
}
