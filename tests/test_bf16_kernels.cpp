// Native bfloat16 CPU kernels (Note [bfloat16 conversion in registers]) against the
// float32 kernels: batch norm (mixed: bfloat16 activations, float32 parameters; training
// and eval, forward and every gradient, the fused BN + add + ReLU), relu, add and the
// engine's gradient accumulation, pooling forward and backward, dropout.
//
// Every case feeds both kernels the same bfloat16-representable values (a float32
// tensor and its exact bfloat16 twin). The bfloat16 kernel computes in float what the
// float32 kernel computes, and rounds once, so each bfloat16 result must be the float32
// result to within one bfloat16 rounding (relative 2^-8), and every float32 result (the
// statistics, grad_weight, grad_bias) must agree to float precision: any arithmetic done
// in 16 bits (say, a batch-norm sum accumulated in bfloat16) shows up far beyond that.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "autograd/ops.h"
#include "core/factory.h"

using namespace loom;

namespace {

// A float32 tensor of bfloat16-representable values and its bfloat16 twin.
struct Twin {
  Tensor f32, bf16;
};

Twin twin(const Shape& shape, uint64_t seed, double scale = 1.0, double offset = 0.0) {
  Generator gen(seed);
  Tensor b = (randn(shape, TensorOptions(kFloat32), &gen) * scale + offset).to(kBFloat16);
  return {b.to(kFloat32), b};
}

std::vector<double> values(const Tensor& t) { return t.detach().to(kFloat64).tolist<double>(); }

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// |got - want| <= rtol * |want| + atol * max|want|, element for element.
void check_close(const Tensor& got, const Tensor& want, double rtol, double atol) {
  const std::vector<double> g = values(got), w = values(want);
  REQUIRE(g.size() == w.size());
  const double scale = max_abs(w);
  int bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - w[i]) <= rtol * std::abs(w[i]) + atol * scale) continue;
    if (++bad <= 3) MESSAGE("element ", i, ": got ", g[i], ", want ", w[i]);
  }
  CHECK_MESSAGE(bad == 0, bad, " of ", g.size(), " elements differ");
}

// A bfloat16 result against the float32 one: one bfloat16 rounding apart.
void check_rounded(const Tensor& got, const Tensor& want, double atol = 1e-5) {
  CHECK(got.dtype() == kBFloat16);
  check_close(got, want, std::ldexp(1.0, -8), atol);
}

// A float32 result computed from bfloat16 inputs against the float32 kernel's.
void check_float(const Tensor& got, const Tensor& want) {
  CHECK(got.dtype() == kFloat32);
  check_close(got, want, 1e-5, 1e-6);
}

void check_equal(const Tensor& got, const Tensor& want) { CHECK(values(got) == values(want)); }

Tensor param(const Shape& shape, uint64_t seed, double scale, double offset, bool requires_grad = true) {
  Generator gen(seed);
  Tensor t = randn(shape, TensorOptions(kFloat32), &gen) * scale + offset;
  return requires_grad ? t.requires_grad_(true) : t;
}

// One batch-norm step on `x`, its outputs and gradients.
struct BatchNormRun {
  Tensor y, running_mean, running_var, grad_x, grad_w, grad_b, grad_residual;
};

BatchNormRun run_batch_norm(const Tensor& x_in, const Tensor& residual_in, const Tensor& grad_y, bool training,
                            bool relu) {
  const int64_t C = x_in.size(1);
  Tensor x = x_in.detach().requires_grad_(true);
  Tensor w = param({C}, 11, 0.5, 1.0), b = param({C}, 12, 0.5, 0.0);
  Tensor residual = residual_in.defined() ? residual_in.detach().requires_grad_(true) : Tensor();
  BatchNormRun r;
  r.running_mean = param({C}, 13, 0.5, 4.0, false);
  r.running_var = param({C}, 14, 0.2, 2.0, false);
  r.y = relu ? batch_norm_relu(x, r.running_mean, r.running_var, w, b, training, 0.1, 1e-5, residual)
             : batch_norm(x, r.running_mean, r.running_var, w, b, training, 0.1, 1e-5);
  r.y.backward(grad_y);
  r.grad_x = x.grad();
  r.grad_w = w.grad();
  r.grad_b = b.grad();
  if (residual.defined()) r.grad_residual = residual.grad();
  return r;
}

void check_batch_norm(bool training, bool relu, bool with_residual) {
  INFO("training=", training, " relu=", relu, " residual=", with_residual);
  // H*W = 35: not a multiple of any vector width. The offset makes |mean| >> std, where
  // statistics accumulated in 16 bits (or as E[x^2] - E[x]^2) fall apart.
  const Twin x = twin({4, 6, 7, 5}, 1, 1.5, 4.0);
  const Twin dy = twin({4, 6, 7, 5}, 2);
  const Twin res = twin({4, 6, 7, 5}, 3);
  const BatchNormRun a = run_batch_norm(x.bf16, with_residual ? res.bf16 : Tensor(), dy.bf16, training, relu);
  const BatchNormRun b = run_batch_norm(x.f32, with_residual ? res.f32 : Tensor(), dy.f32, training, relu);
  check_rounded(a.y, b.y);
  check_float(a.running_mean, b.running_mean);  // updated in place, still float32
  check_float(a.running_var, b.running_var);
  // dx = a*g + b*x + c0 per channel: allow float-level differences where terms cancel.
  check_rounded(a.grad_x, b.grad_x, 1e-4);
  check_float(a.grad_w, b.grad_w);
  check_float(a.grad_b, b.grad_b);
  if (with_residual) check_rounded(a.grad_residual, b.grad_residual);
}

}  // namespace

TEST_CASE("the in-register conversion (Note [bfloat16 conversion in registers]) is BFloat16(float), bit for bit") {
  // Ties round to even (1 + 2^-8 down, 1 + 3 * 2^-8 up), NaN becomes 0x7fc0, infinities,
  // signed zeros, denormals and the largest finite floats keep their meaning.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f, 3.14159f,
                          1e-40f, -1e-42f, 3.4e38f, -3.4e38f, inf, -inf, std::nanf(""), -std::nanf("")};
  for (int i = 0; i < 1000; ++i) v.push_back(std::ldexp(static_cast<float>(i * 7919 % 1000) / 1000.0f - 0.5f, i % 60 - 30));
  Tensor f = from_vector<float>(v, {static_cast<int64_t>(v.size())});
  Tensor b = f.to(kBFloat16);  // the CPU copy kernel: BFloat16::round_to_bits
  Tensor back = b.to(kFloat32);  // and back: a shift
  const BFloat16* got = b.data_ptr<BFloat16>();
  const float* wide = back.data_ptr<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    INFO("value ", v[i]);
    REQUIRE(got[i].bits == BFloat16(v[i]).bits);
    CHECK((std::isnan(wide[i]) || wide[i] == static_cast<float>(BFloat16(v[i]))));
  }
}

TEST_CASE("batch_norm on bfloat16 input with float32 parameters matches the float32 kernel") {
  for (bool training : {true, false}) check_batch_norm(training, /*relu=*/false, /*residual=*/false);
}

TEST_CASE("batch_norm_relu (Note [Fused BatchNorm epilogue]) on bfloat16 matches the float32 kernel") {
  for (bool training : {true, false})
    for (bool residual : {false, true}) check_batch_norm(training, /*relu=*/true, residual);
}

TEST_CASE("batch_norm on bfloat16: output dtypes, no running statistics, and what it refuses") {
  const Twin x = twin({3, 4, 5, 5}, 1);
  Tensor w = ones({4}), b = zeros({4});
  Tensor y = batch_norm(x.bf16, Tensor(), Tensor(), w, b, true);
  CHECK(y.dtype() == kBFloat16);
  check_rounded(y, batch_norm(x.f32, Tensor(), Tensor(), w, b, true));
  // No parameters at all: the statistics are float32 all the same.
  check_rounded(batch_norm(x.bf16, Tensor(), Tensor(), Tensor(), Tensor(), true),
                batch_norm(x.f32, Tensor(), Tensor(), Tensor(), Tensor(), true));
  // float16 input takes the same kernel (scalar conversions).
  Tensor y16 = batch_norm(x.f32.to(kFloat16), Tensor(), Tensor(), w, b, true);
  CHECK(y16.dtype() == kFloat16);
  check_close(y16, batch_norm(x.f32.to(kFloat16).to(kFloat32), Tensor(), Tensor(), w, b, true), 1e-3, 1e-4);
  // bfloat16 parameters have no CPU kernel; mixed parameter dtypes are refused by the op.
  CHECK_THROWS_WITH_AS(batch_norm(x.bf16, Tensor(), Tensor(), w.to(kBFloat16), b.to(kBFloat16), true),
                       doctest::Contains("needs float32 weight, bias, running and saved statistics"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x.bf16, Tensor(), Tensor(), w, b.to(kBFloat16), true),
                       doctest::Contains("expected bias of dtype float32"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x.f32, Tensor(), Tensor(), w.to(kFloat64), b, true),
                       doctest::Contains("expected weight of dtype float32 on cpu:0 (the input's), got float64"), Error);
}

TEST_CASE("relu, add and the engine's gradient accumulation on bfloat16") {
  const Twin a = twin({3, 33, 17}, 1), b = twin({3, 33, 17}, 2), col = twin({33, 1}, 3);
  check_equal(relu(a.bf16), relu(a.f32));  // relu only moves values: exact
  CHECK(relu(a.bf16).dtype() == kBFloat16);
  check_rounded(add(a.bf16, b.bf16), add(a.f32, b.f32));
  check_rounded(add(a.bf16, b.bf16, 0.3), add(a.f32, b.f32, 0.3));
  check_rounded(add(a.bf16, col.bf16), add(a.f32, col.f32));  // broadcast
  check_rounded(a.bf16 * b.bf16, a.f32 * b.f32);
  check_rounded(a.bf16.transpose(0, 2) - b.bf16.transpose(0, 2), a.f32.transpose(0, 2) - b.f32.transpose(0, 2));
  CHECK(values(gt(a.bf16, b.bf16)) == values(gt(a.f32, b.f32)));

  // x feeds two ops, so the engine adds their gradients (in bfloat16, rounded once; the
  // factor 0.5 keeps the second gradient exact, so the sum is the only rounding).
  const Twin g = twin({3, 33, 17}, 4);
  auto grad_of = [&](const Tensor& x_in, const Tensor& gy) {
    Tensor x = x_in.detach().requires_grad_(true);
    (relu(x) + x * 0.5).backward(gy);
    return x.grad();
  };
  Tensor g16 = grad_of(a.bf16, g.bf16);
  CHECK(g16.dtype() == kBFloat16);
  check_rounded(g16, grad_of(a.f32, g.f32));
  // relu's backward (threshold_backward) passes the gradient through bit for bit.
  Tensor x = a.bf16.detach().requires_grad_(true);
  relu(x).backward(g.bf16);
  Tensor x32 = a.f32.detach().requires_grad_(true);
  relu(x32).backward(g.f32);
  check_equal(x.grad(), x32.grad());
}

TEST_CASE("pooling on bfloat16: forward and backward match the float32 kernels") {
  // Odd sizes, overlapping windows (stride < kernel) and uneven adaptive bins, so that
  // the backward adds several shares into one element.
  const Twin x = twin({2, 3, 9, 11}, 1);
  struct Pool {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
  };
  const std::vector<Pool> pools = {
      {"max_pool2d 3x3 s2 p1", [](const Tensor& t) { return max_pool2d(t, {3, 3}, {2, 2}, {1, 1}); }},
      {"avg_pool2d 3x3 s2 p1", [](const Tensor& t) { return avg_pool2d(t, {3, 3}, {2, 2}, {1, 1}, false, false); }},
      {"avg_pool2d 2x2 ceil", [](const Tensor& t) { return avg_pool2d(t, {2, 2}, {}, {0, 0}, true, true); }},
      {"adaptive_avg_pool2d 1x1", [](const Tensor& t) { return adaptive_avg_pool2d(t, {1, 1}); }},
      {"adaptive_avg_pool2d 4x3", [](const Tensor& t) { return adaptive_avg_pool2d(t, {4, 3}); }},
  };
  for (const Pool& pool : pools) {
    INFO(pool.name);
    Tensor x16 = x.bf16.detach().requires_grad_(true), x32 = x.f32.detach().requires_grad_(true);
    Tensor y16 = pool.f(x16), y32 = pool.f(x32);
    check_rounded(y16, y32);
    const Twin g = twin(y32.shape(), 2);
    y16.backward(g.bf16);
    y32.backward(g.f32);
    check_rounded(x16.grad(), x32.grad());
  }
  check_equal(max_pool2d(x.bf16, {3, 3}, {2, 2}, {1, 1}), max_pool2d(x.f32, {3, 3}, {2, 2}, {1, 1}));  // exact
  CHECK(max_pool2d(x.f32.to(kFloat16), {2, 2}).dtype() == kFloat16);  // float16: the same kernels
}

TEST_CASE("dropout on bfloat16 drops the same units as float32 with the same seed") {
  const Twin x = twin({4, 1000}, 1);
  for (double p : {0.5, 0.3}) {
    INFO("p=", p);
    Generator gen16(42), gen32(42);
    Tensor x16 = x.bf16.detach().requires_grad_(true), x32 = x.f32.detach().requires_grad_(true);
    Tensor y16 = dropout(x16, p, true, &gen16), y32 = dropout(x32, p, true, &gen32);
    CHECK(y16.dtype() == kBFloat16);
    const std::vector<double> a = values(y16), b = values(y32);
    int dropped = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      REQUIRE((a[i] == 0) == (b[i] == 0));
      dropped += a[i] == 0;
    }
    CHECK(dropped > 0);
    // PyTorch's semantics: the mask is bfloat16, so the scale 1/(1-p) is rounded to it.
    const float scale = static_cast<float>(BFloat16(static_cast<float>(1.0 / (1.0 - p))));
    check_rounded(y16, (x.f32 * static_cast<double>(scale)) * ne(y32, zeros_like(y32)).to(kFloat32), 0);
    if (p == 0.5) check_equal(y16, y32);  // scale 2 is exact
    y16.backward(ones_like(y16));
    CHECK(x16.grad().dtype() == kBFloat16);
    CHECK(values(x16.grad()) == values(ne(y32, zeros_like(y32)).to(kFloat32) * static_cast<double>(scale)));
  }
}

TEST_CASE("gelu on bfloat16 (CPU autocast's activations): forward and backward are the float32 kernel's, rounded once") {
  const Twin x = twin({2, 3, 5, 7}, 3);
  for (const char* approximate : {"none", "tanh"}) {
    INFO(approximate);
    Tensor x16 = x.bf16.detach().requires_grad_(true), x32 = x.f32.detach().requires_grad_(true);
    Tensor y16 = gelu(x16, approximate), y32 = gelu(x32, approximate);
    CHECK(y16.dtype() == kBFloat16);
    check_rounded(y16, y32);
    const Twin g = twin(y32.shape(), 4);
    y16.backward(g.bf16);
    y32.backward(g.f32);
    check_rounded(x16.grad(), x32.grad());
  }
}
