// autocast (autograd/autocast.h): which ops run in which dtype inside and outside a
// scope, nesting and the enabled flag, per-device and per-thread scopes, gradients that
// reach float32 leaves as float32, and the weight cast cache.
//
// Everything runs on the CPU with bfloat16/float16 (CPU kernels run 16-bit floats
// natively or stage them through float32: Note [16-bit CPU kernels stage through
// float32]), under the CPU's op lists (Note [Autocast op lists per device]); the CUDA
// cases at the end repeat the dtype checks on cuda:0 and skip (doctest's "skipped"
// count) without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <thread>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/factory.h"
#include "device_compare.h"  // defines: rel_error
#include "cuda/device.h"  // defines: is_available
#include "nn/nn.h"

using namespace loom;
using loom::testing::rel_error;
using autocast::CastPolicy;

namespace {

const bool kGpu = cuda::is_available();

Tensor rnd(const Shape& shape, uint64_t seed, DType dtype = kFloat32, bool requires_grad = false) {
  Generator gen(seed);
  Tensor t = randn(shape, TensorOptions(kFloat32), &gen).to(dtype);
  if (requires_grad) t.requires_grad_(true);
  return t;
}

}  // namespace

TEST_CASE("policy per device (Note [Autocast op lists per device]): matrix products in 16 bits everywhere") {
  for (DeviceType device : {DeviceType::CPU, DeviceType::CUDA}) {
    INFO(device_type_name(device));
    for (const char* op : {"conv2d", "mm", "bmm", "matmul", "linear"})
      CHECK_MESSAGE(autocast::policy_of(op, device) == CastPolicy::LowerPrecision, op);
    for (const char* op : {"log_softmax", "softmax", "nll_loss", "cross_entropy", "sync_batch_norm"})
      CHECK_MESSAGE(autocast::policy_of(op, device) == CastPolicy::Float32, op);
    for (const char* op : {"relu", "add", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "reshape", "dropout"})
      CHECK_MESSAGE(autocast::policy_of(op, device) == CastPolicy::None, op);
  }
  // CUDA: batch norm and the reductions in float32 as well. CPU: on no list, as in
  // PyTorch's CPU autocast: batch norm takes 16-bit input with float32 parameters.
  for (const char* op : {"batch_norm", "batch_norm_relu", "sum", "mean", "var"}) {
    CHECK_MESSAGE(autocast::policy_of(op, DeviceType::CUDA) == CastPolicy::Float32, op);
    CHECK_MESSAGE(autocast::policy_of(op, DeviceType::CPU) == CastPolicy::None, op);
  }
}

TEST_CASE("16-bit CPU kernels (Note [16-bit CPU kernels stage through float32]) match float64 to 16-bit rounding") {
  for (DType dtype : {kBFloat16, kFloat16}) {
    INFO(dtype);
    const double tol = dtype == kBFloat16 ? 1e-2 : 2e-3;
    Tensor a = rnd({6, 5}, 1), b = rnd({5, 4}, 2), c = rnd({6, 4}, 3);
    Tensor a16 = a.to(dtype), b16 = b.to(dtype), c16 = c.to(dtype);
    auto f64 = [](const Tensor& t) { return t.to(kFloat64); };
    CHECK(mm(a16, b16).dtype() == dtype);
    CHECK(rel_error(mm(a16, b16), mm(f64(a16), f64(b16))) < tol);
    CHECK(rel_error(mm(a16.t(), c16), mm(f64(a16).t(), f64(c16))) < tol);  // a transposed operand
    CHECK(rel_error(add(c16, c16, 0.5), f64(c16) * 1.5) < tol);
    CHECK(rel_error(relu(c16), relu(f64(c16))) < tol);
    {  // relu's gradient (threshold_backward) in 16 bits, as autocast's backward needs after a conv
      Tensor r16 = c16.detach().requires_grad_(true), r64 = f64(c16).detach().requires_grad_(true);
      relu(r16).backward(ones_like(c16));
      relu(r64).backward(ones_like(f64(c16)));
      CHECK(r16.grad().dtype() == dtype);
      CHECK(r16.grad().to(kFloat64).tolist<double>() == r64.grad().tolist<double>());
    }
    CHECK(rel_error(sum(c16, {0}), sum(f64(c16), {0})) < tol);
    CHECK(argmax(c16, 1).tolist<int64_t>() == argmax(f64(c16), 1).tolist<int64_t>());
    // Factories fill 16-bit tensors directly, as torch.zeros(..., dtype=torch.float16) does.
    CHECK(zeros({3}, dtype).to(kFloat64).tolist<double>() == std::vector<double>{0, 0, 0});
    CHECK(full({2}, 2.5, TensorOptions(dtype)).to(kFloat64).tolist<double>() == std::vector<double>{2.5, 2.5});
    Tensor x = rnd({2, 3, 6, 6}, 4).to(dtype), w = rnd({4, 3, 3, 3}, 5).to(dtype);
    CHECK(rel_error(conv2d(x, w, Tensor(), {2, 2}, {1, 1}), conv2d(f64(x), f64(w), Tensor(), {2, 2}, {1, 1})) < tol);
  }
}

TEST_CASE("outside a scope nothing is cast; inside, each op gets its policy's dtype") {
  Tensor a = rnd({8, 16}, 1), b = rnd({16, 4}, 2);
  CHECK(!autocast::is_enabled(DeviceType::CPU));
  CHECK(mm(a, b).dtype() == kFloat32);

  autocast::Guard guard(DeviceType::CPU, kBFloat16);
  CHECK(autocast::is_enabled(DeviceType::CPU));
  CHECK(autocast::get_dtype(DeviceType::CPU) == kBFloat16);

  Tensor y = mm(a, b);
  CHECK(y.dtype() == kBFloat16);
  CHECK(rel_error(y, mm(a.to(kFloat64), b.to(kFloat64))) < 1e-2);  // bf16 operands, float32 accumulation
  CHECK(matmul(a, b).dtype() == kBFloat16);
  CHECK(matmul(rnd({2, 8, 16}, 3), b).dtype() == kBFloat16);
  CHECK(bmm(rnd({2, 8, 16}, 4), rnd({2, 16, 4}, 5)).dtype() == kBFloat16);
  CHECK(linear(a, rnd({4, 16}, 6), rnd({4}, 7)).dtype() == kBFloat16);
  CHECK(linear(rnd({3, 5, 16}, 8), rnd({4, 16}, 9)).dtype() == kBFloat16);
  Tensor x = rnd({2, 3, 8, 8}, 10), w = rnd({4, 3, 3, 3}, 11);
  Tensor c = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
  CHECK(c.dtype() == kBFloat16);
  CHECK(rel_error(c, conv2d(x.to(kFloat64), w.to(kFloat64), Tensor(), {1, 1}, {1, 1})) < 2e-2);

  // The float32 list takes the 16-bit outputs back to float32; the CPU's reductions are
  // on no list and keep the dtype that arrives (accumulating in float32).
  CHECK(sum(y).dtype() == kBFloat16);
  CHECK(sum(y, {1}).dtype() == kBFloat16);
  CHECK(mean(y).dtype() == kBFloat16);
  CHECK(rel_error(mean(y), mean(y.to(kFloat64))) < 1e-2);
  CHECK(var(y, {0}).dtype() == kBFloat16);
  CHECK(log_softmax(y, 1).dtype() == kFloat32);
  CHECK(softmax(y, 1).dtype() == kFloat32);
  Tensor target = from_vector<int64_t>({0, 1, 2, 3, 0, 1, 2, 3}, {8});
  CHECK(cross_entropy(y, target).dtype() == kFloat32);
  CHECK(nll_loss(log_softmax(y, 1), target).dtype() == kFloat32);
  CHECK(nll_loss(y, target).dtype() == kFloat32);

  // Batch norm: 16-bit input, float32 weight and statistics -> the mixed kernel, 16-bit
  // output, float32 statistics (Note [Mixed-precision batch norm on the CPU]).
  Tensor mean_ = zeros({4}), var_ = ones({4});
  Tensor bn = batch_norm(c, mean_, var_, ones({4}), zeros({4}), /*training=*/true);
  CHECK(bn.dtype() == kBFloat16);
  CHECK(mean_.dtype() == kFloat32);
  CHECK(sum(abs(mean_)).item<float>() > 0);  // the running statistics were updated in place
  CHECK(rel_error(mean_, mean(c.to(kFloat64), {0, 2, 3}) * 0.1) < 1e-5);  // float32 statistics of the bf16 values
  CHECK(batch_norm_relu(c, Tensor(), Tensor(), ones({4}), zeros({4}), true).dtype() == kBFloat16);
  CHECK(max_pool2d(bn, {2, 2}).dtype() == kBFloat16);
  CHECK(adaptive_avg_pool2d(bn, {1, 1}).dtype() == kBFloat16);
  CHECK(dropout(bn, 0.5, true).dtype() == kBFloat16);

  // Ops off both lists run in the dtype that arrives.
  CHECK(relu(a).dtype() == kFloat32);
  CHECK(relu(y).dtype() == kBFloat16);
  CHECK(reshape(y, {-1}).dtype() == kBFloat16);
}

TEST_CASE("float64 and integer tensors are never cast") {
  autocast::Guard guard(DeviceType::CPU, kBFloat16);
  Tensor a = rnd({4, 4}, 1, kFloat64), b = rnd({4, 4}, 2, kFloat64);
  CHECK(mm(a, b).dtype() == kFloat64);
  CHECK(sum(a).dtype() == kFloat64);
  Tensor i = arange(6);
  CHECK(sum(i).dtype() == kInt64);
}

TEST_CASE("a 16-bit input under a float16 scope is cast to float16 too (every eligible float goes)") {
  autocast::Guard guard(DeviceType::CPU, kFloat16);
  CHECK(mm(rnd({4, 4}, 1, kBFloat16), rnd({4, 4}, 2)).dtype() == kFloat16);
}

TEST_CASE("scopes nest: inner scopes change dtype or switch autocast off, and the outer state returns") {
  Tensor a = rnd({4, 4}, 1), b = rnd({4, 4}, 2);
  {
    autocast::Guard outer(DeviceType::CPU, kBFloat16);
    CHECK(mm(a, b).dtype() == kBFloat16);
    {
      autocast::Guard off(DeviceType::CPU, std::nullopt, /*enabled=*/false);
      CHECK(!autocast::is_enabled(DeviceType::CPU));
      CHECK(mm(a, b).dtype() == kFloat32);
      {
        autocast::Guard half(DeviceType::CPU, kFloat16);
        CHECK(mm(a, b).dtype() == kFloat16);
      }
      CHECK(mm(a, b).dtype() == kFloat32);
    }
    CHECK(mm(a, b).dtype() == kBFloat16);
    {
      autocast::Guard same_dtype(DeviceType::CPU);  // dtype kept from the enclosing scope
      CHECK(autocast::get_dtype(DeviceType::CPU) == kBFloat16);
    }
  }
  CHECK(!autocast::is_enabled(DeviceType::CPU));
  CHECK(!autocast::any_enabled());
  CHECK(mm(a, b).dtype() == kFloat32);
}

TEST_CASE("a scope affects only its device type and its thread") {
  Tensor a = rnd({4, 4}, 1), b = rnd({4, 4}, 2);
  {
    autocast::Guard cuda_scope(DeviceType::CUDA, kBFloat16);
    CHECK(autocast::is_enabled(DeviceType::CUDA));
    CHECK(mm(a, b).dtype() == kFloat32);  // CPU tensors: untouched by a CUDA scope
  }
  autocast::Guard guard(DeviceType::CPU, kBFloat16);
  DType other_thread = kFloat64;
  std::thread([&] { other_thread = mm(a, b).dtype(); }).join();
  CHECK(other_thread == kFloat32);  // See Note [Autocast state is per thread]
  CHECK(mm(a, b).dtype() == kBFloat16);
}

TEST_CASE("only float16 and bfloat16 are autocast dtypes; the error says so") {
  CHECK_THROWS_WITH_AS(autocast::Guard(DeviceType::CPU, kFloat32),
                       doctest::Contains("expected dtype float16 or bfloat16"), Error);
  CHECK(!autocast::is_enabled(DeviceType::CPU));  // the failed scope changed nothing
}

TEST_CASE("gradients flow through the casts to float32 leaves, as float32, close to a float32 run") {
  Tensor x = rnd({6, 3, 8, 8}, 1);
  Tensor w = rnd({4, 3, 3, 3}, 2, kFloat32, true);
  Tensor fc_w = rnd({5, 4 * 8 * 8}, 3, kFloat32, true);
  Tensor fc_b = rnd({5}, 4, kFloat32, true);
  Tensor gamma = ones({4}, TensorOptions(kFloat32).requires_grad(true));
  Tensor beta = zeros({4}, TensorOptions(kFloat32).requires_grad(true));
  Tensor target = from_vector<int64_t>({0, 1, 2, 3, 4, 0}, {6});
  auto forward = [&] {
    Tensor h = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
    h = batch_norm_relu(h, Tensor(), Tensor(), gamma, beta, true);
    return cross_entropy(linear(h.flatten(1), fc_w, fc_b), target);
  };

  Tensor loss32 = forward();
  loss32.backward();
  std::vector<Tensor> leaves = {w, fc_w, fc_b, gamma, beta}, want;
  for (Tensor& t : leaves) {
    want.push_back(t.grad().detach().clone());
    t.set_grad(Tensor());
  }

  Tensor loss;
  {
    autocast::Guard guard(DeviceType::CPU, kBFloat16);
    loss = forward();
  }
  CHECK(loss.dtype() == kFloat32);
  CHECK(rel_error(loss, loss32) < 2e-2);
  loss.backward();
  for (size_t i = 0; i < leaves.size(); ++i) {
    INFO("leaf ", i);
    REQUIRE(leaves[i].grad().defined());
    CHECK(leaves[i].grad().dtype() == kFloat32);
    CHECK(leaves[i].grad().shape() == leaves[i].shape());
    CHECK(rel_error(leaves[i].grad(), want[i]) < 5e-2);
  }
}

TEST_CASE("backward inside a scope runs in the forward's dtypes (Note [No autocast in backward])") {
  // linear's backward sums its bfloat16 output gradient for the bias: re-cast by the
  // scope, that sum would hand a float32 gradient to a bfloat16 input.
  Tensor a = rnd({4, 8}, 1, kFloat32, true), b = rnd({3, 8}, 2, kFloat32, true), c = rnd({3}, 3, kFloat32, true);
  autocast::Guard guard(DeviceType::CPU, kBFloat16);
  sum(linear(a, b, c)).backward();
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(b.grad().dtype() == kFloat32);
  CHECK(c.grad().dtype() == kFloat32);
  CHECK(autocast::is_enabled(DeviceType::CPU));  // restored after backward
}

TEST_CASE("weight cast cache: a parameter is cast once per scope; activations are not cached") {
  Tensor w = rnd({8, 8}, 1, kFloat32, true);
  Tensor x = rnd({4, 8}, 2);
  {
    autocast::Guard guard(DeviceType::CPU, kBFloat16);
    CHECK(autocast::cache_size() == 0);
    Tensor c1 = autocast::cast(w, kBFloat16, DeviceType::CPU);
    Tensor c2 = autocast::cast(w, kBFloat16, DeviceType::CPU);
    CHECK(c1.dtype() == kBFloat16);
    CHECK(c1.unsafe_impl() == c2.unsafe_impl());
    CHECK(autocast::cache_size() == 1);

    // Activations (not leaves requiring grad) are cast every time, never cached.
    Tensor x1 = autocast::cast(x, kBFloat16, DeviceType::CPU);
    CHECK(x1.unsafe_impl() != autocast::cast(x, kBFloat16, DeviceType::CPU).unsafe_impl());
    CHECK(autocast::cache_size() == 1);

    // The same weight used twice in a forward: one cast, and both uses' gradients arrive.
    Tensor y = mm(x, w) + mm(x * 2.0, w);
    CHECK(autocast::cache_size() == 1);
    sum(y).backward();
    REQUIRE(w.grad().defined());
    CHECK(w.grad().dtype() == kFloat32);
    // d/dw sum(x w + 2x w) = 3 * x^T 1
    Tensor want = matmul(x.t().to(kFloat64), ones({4, 8}, TensorOptions(kFloat64))) * 3.0;
    CHECK(rel_error(w.grad(), want) < 2e-2);

    // An in-place update of the weight (its version moves) invalidates the entry.
    {
      NoGradGuard no_grad;
      w.mul_(wrap_scalar(0.5, w));
    }
    Tensor c3 = autocast::cast(w, kBFloat16, DeviceType::CPU);
    CHECK(c3.unsafe_impl() != c1.unsafe_impl());
    CHECK(rel_error(c3, w) < 1e-2);

    // A cast made under no_grad carries no graph, so it is a separate entry.
    {
      NoGradGuard no_grad;
      Tensor c4 = autocast::cast(w, kBFloat16, DeviceType::CPU);
      CHECK(!c4.requires_grad());
    }
    Tensor c5 = autocast::cast(w, kBFloat16, DeviceType::CPU);
    CHECK(c5.requires_grad());
    CHECK(c5.unsafe_impl() == c3.unsafe_impl());
  }
  CHECK(autocast::cache_size() == 0);  // cleared when the outermost scope closes

  {
    autocast::Guard no_cache(DeviceType::CPU, kBFloat16, true, /*cache_enabled=*/false);
    Tensor c1 = autocast::cast(w, kBFloat16, DeviceType::CPU);
    CHECK(c1.unsafe_impl() != autocast::cast(w, kBFloat16, DeviceType::CPU).unsafe_impl());
    CHECK(autocast::cache_size() == 0);
  }
}

TEST_CASE("nn modules under autocast: ResNet-style block, float32 parameters and gradients") {
  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 4, 3, 1, 1, 1, 1, false), std::make_shared<nn::BatchNorm2d>(4),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::AdaptiveAvgPool2d>(1), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(4, 3)});
  Tensor x = rnd({4, 3, 8, 8}, 1);
  Tensor target = from_vector<int64_t>({0, 1, 2, 0}, {4});
  Tensor loss;
  {
    autocast::Guard guard(DeviceType::CPU, kBFloat16);
    Tensor logits = model->forward(x);
    CHECK(logits.dtype() == kBFloat16);  // the last op is linear
    loss = cross_entropy(logits, target);
  }
  CHECK(loss.dtype() == kFloat32);
  loss.backward();
  for (const auto& [key, p] : model->named_parameters()) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    INFO(name);
    CHECK(p.dtype() == kFloat32);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().dtype() == kFloat32);
  }
}

// ---- on a GPU ---------------------------------------------------------------------------

TEST_CASE("CUDA availability") {
  if (!kGpu) MESSAGE("autocast CUDA cases are skipped: ", cuda::unavailable_reason());
}

TEST_CASE("CUDA autocast: dtypes on cuda:0, gradients in float32" * doctest::skip(!kGpu)) {
  const Device gpu("cuda:0");
  for (DType dtype : {kBFloat16, kFloat16}) {
    INFO(dtype);
    Tensor a = rnd({16, 32}, 1).to(gpu), b = rnd({32, 8}, 2).to(gpu).requires_grad_(true);
    Tensor x = rnd({2, 3, 8, 8}, 3).to(gpu), w = rnd({4, 3, 3, 3}, 4).to(gpu).requires_grad_(true);
    Tensor loss;
    {
      autocast::Guard guard(DeviceType::CUDA, dtype);
      Tensor y = mm(a, b);
      CHECK(y.dtype() == dtype);
      CHECK(rel_error(y, mm(a.to(Device("cpu")).to(kFloat64), b.detach().to(Device("cpu")).to(kFloat64))) < 1e-2);
      Tensor c = conv2d(x, w, Tensor(), {1, 1}, {1, 1});
      CHECK(c.dtype() == dtype);
      CHECK(sum(c).dtype() == kFloat32);
      CHECK(log_softmax(y, 1).dtype() == kFloat32);
      // CPU tensors are untouched by a CUDA scope.
      CHECK(mm(rnd({2, 2}, 5), rnd({2, 2}, 6)).dtype() == kFloat32);
      loss = sum(y) + sum(c);
    }
    loss.backward();
    CHECK(b.grad().dtype() == kFloat32);
    CHECK(w.grad().dtype() == kFloat32);
    CHECK(b.grad().device() == gpu);
  }
}

TEST_CASE("gradient accumulation inside one scope: the cached weight cast is back-propagated through twice") {
  // Note [Nodes that save nothing]: both forwards use the same cached bfloat16 cast of w,
  // whose node must survive the first backward, as in PyTorch.
  Tensor w = randn({3, 4}).requires_grad_(true);
  Tensor x = randn({2, 3});
  {
    autocast::Guard guard(DeviceType::CPU, kBFloat16);
    mm(x, w).sum().backward();
    mm(x, w).sum().backward();
  }
  Tensor want = mm(x.to(kFloat64).t(), ones({2, 4}, kFloat64)) * 2.0;
  CHECK(w.grad().dtype() == kFloat32);
  CHECK(rel_error(w.grad(), want) < 2e-2);  // d sum(x w) / dw = x^T 1, twice
  // A node that saved tensors still refuses a second backward.
  Tensor a = randn({3}).requires_grad_(true);
  Tensor y = (a * a).sum();
  y.backward();
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("backward through the graph a second time"), Error);
}
