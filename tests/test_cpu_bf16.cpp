// bfloat16 kernels on the CPU (Note [bfloat16 on the CPU], core/cpu/bf16_path.h): conv2d
// (forward, input, weight and bias gradients) and mm / bmm / linear against the float32
// kernels on the same bfloat16-representable values, to bfloat16 rounding; float32
// weight and bias gradients from bfloat16 operands, to float32 rounding; and autocast's
// float32 parameters getting those float32 gradients directly.
//
// meson runs this file twice: on the CPU's own path (native oneDNN bf16 where the CPU
// has AVX512-BF16), and with LOOM_CPU_BF16=staging (Note [16-bit CPU kernels stage
// through float32]), so both paths keep one contract.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "core/cpu/bf16_path.h"  // defines: bf16_path, bf16_path_description
#include "core/factory.h"
#include "device_compare.h"  // defines: rel_error
#include "core/kernels.h"         // defines: conv2d_backward_kernel (the float32-gradient contract)

using namespace loom;
using loom::testing::rel_error;

namespace {

// Normal values rounded to bfloat16 and back: both kernels see exactly the same inputs.
Tensor rnd(const Shape& shape, uint64_t seed, DType dtype = kFloat32) {
  Generator gen(seed);
  return randn(shape, TensorOptions(kFloat32), &gen).to(kBFloat16).to(dtype);
}

// A fresh leaf holding t's values in dtype.
Tensor leaf(const Tensor& t, DType dtype) { return t.to(dtype).detach().requires_grad_(true); }

// One rounding of a float32-accumulated result to bfloat16 is off by at most 2^-8 of
// the value (half of bfloat16's 2^-7 spacing); a bfloat16 accumulation over these
// reductions (27 to 576 terms) is off by several times that, so this bound tells the
// two apart.
constexpr double kBf16Tol = 5e-3;
// A float32 result from bfloat16 operands differs from the float32 kernel's only in the
// order of its float32 additions.
constexpr double kFloat32Tol = 1e-4;

struct ConvCase {
  const char* name;
  Shape input, weight;
  int64_t stride, padding, groups;
  bool bias;
};

const ConvCase kConvCases[] = {
    {"3x3 pad 1 (a ResNet block)", {4, 16, 8, 8}, {32, 16, 3, 3}, 1, 1, 1, true},
    {"3x3 stride 2 pad 1 (a downsampling block)", {2, 16, 9, 9}, {32, 16, 3, 3}, 2, 1, 1, false},
    {"1x1 stride 2 (the shortcut)", {2, 32, 8, 8}, {64, 32, 1, 1}, 2, 0, 1, false},
    {"3 input channels (the stem)", {2, 3, 12, 12}, {16, 3, 3, 3}, 1, 1, 1, true},
    {"groups 2", {2, 16, 6, 6}, {16, 8, 3, 3}, 1, 1, 2, true},
};

}  // namespace

TEST_CASE("the bf16 path is one of the three and says which") {
  const cpu::Bf16Path path = cpu::bf16_path();
  CHECK((path == cpu::Bf16Path::Native || path == cpu::Bf16Path::Emulated || path == cpu::Bf16Path::Staging));
  const std::string description = cpu::bf16_path_description();
  MESSAGE("bf16 on this CPU: " << description);
}

TEST_CASE("conv2d in bfloat16: forward, input, weight and bias gradients match float32 to bf16 rounding") {
  for (const ConvCase& c : kConvCases) {
    INFO(c.name);
    const Tensor x = rnd(c.input, 1), w = rnd(c.weight, 2), b = c.bias ? rnd({c.weight[0]}, 3) : Tensor();
    auto run = [&](DType dtype) {
      Tensor xl = leaf(x, dtype), wl = leaf(w, dtype);
      Tensor bl = c.bias ? leaf(b, dtype) : Tensor();
      Tensor y = conv2d(xl, wl, bl, {c.stride}, {c.padding}, {1}, c.groups);
      Generator gen(4);
      y.backward(randn(y.shape(), TensorOptions(kFloat32), &gen).to(kBFloat16).to(dtype));
      return std::vector<Tensor>{y, xl.grad(), wl.grad(), c.bias ? bl.grad() : Tensor()};
    };
    const std::vector<Tensor> want = run(kFloat32), got = run(kBFloat16);
    const char* names[] = {"output", "input gradient", "weight gradient", "bias gradient"};
    for (size_t i = 0; i < want.size(); ++i) {
      if (!want[i].defined()) continue;
      INFO(names[i]);
      CHECK(got[i].dtype() == kBFloat16);
      CHECK(rel_error(got[i], want[i]) < kBf16Tol);
    }
  }
}

TEST_CASE("conv2d backward writes float32 weight and bias gradients from bfloat16 operands, unrounded") {
  for (const ConvCase& c : kConvCases) {
    INFO(c.name);
    Conv2dParams p;
    p.stride[0] = p.stride[1] = c.stride;
    p.padding[0] = p.padding[1] = c.padding;
    p.groups = c.groups;
    const Tensor x = rnd(c.input, 1), w = rnd(c.weight, 2);
    const Tensor y = conv2d(x, w, Tensor(), {c.stride}, {c.padding}, {1}, c.groups);
    const Tensor g = rnd(y.shape(), 4);
    auto run = [&](DType dtype) {
      Tensor none, gw = empty(w.shape(), TensorOptions(kFloat32)), gb = empty({w.size(0)}, TensorOptions(kFloat32));
      conv2d_backward_kernel(DeviceType::CPU)(g.to(dtype), x.to(dtype), w.to(dtype), p, none, gw, gb);
      return std::make_pair(gw, gb);
    };
    const auto [gw32, gb32] = run(kFloat32);
    const auto [gw16, gb16] = run(kBFloat16);
    CHECK(rel_error(gw16, gw32) < kFloat32Tol);
    CHECK(rel_error(gb16, gb32) < kFloat32Tol);
  }
}

TEST_CASE("under autocast a float32 parameter gets its conv2d gradient in float32, not rounded to 16 bits") {
  const Tensor x = rnd({2, 8, 6, 6}, 1);
  Tensor w = leaf(rnd({8, 8, 3, 3}, 2), kFloat32), b = leaf(rnd({8}, 3), kFloat32);
  const Tensor g = rnd({2, 8, 6, 6}, 4);
  Tensor y;
  {
    autocast::Guard guard(DeviceType::CPU, kBFloat16);
    y = conv2d(x, w, b, {1}, {1});
  }
  CHECK(y.dtype() == kBFloat16);
  y.backward(g.to(kBFloat16));
  REQUIRE(w.grad().defined());
  REQUIRE(b.grad().defined());
  CHECK(w.grad().dtype() == kFloat32);
  Tensor gw, gb;
  {
    Tensor w32 = leaf(w, kFloat32), b32 = leaf(b, kFloat32);
    conv2d(x.to(kBFloat16).to(kFloat32), w32, b32, {1}, {1}).backward(g);
    gw = w32.grad();
    gb = b32.grad();
  }
  CHECK(rel_error(w.grad(), gw) < kFloat32Tol);
  CHECK(rel_error(b.grad(), gb) < kFloat32Tol);
  // the same parameter used twice in a scope (one cached cast): both gradients arrive
  w.set_grad(Tensor());
  {
    autocast::Guard guard(DeviceType::CPU, kBFloat16);
    y = add(conv2d(x, w, Tensor(), {1}, {1}), conv2d(x, w, Tensor(), {1}, {1}));
  }
  y.backward(g.to(kBFloat16));
  CHECK(rel_error(w.grad(), gw * 2.0) < kFloat32Tol);
}

TEST_CASE("mm, bmm and linear in bfloat16 match float32 to bf16 rounding, in every operand layout") {
  auto both = [](const Tensor& t) { return std::make_pair(t, t.to(kBFloat16)); };
  const auto [a, a16] = both(rnd({33, 70}, 1));
  const auto [b, b16] = both(rnd({70, 45}, 2));
  const auto [bt, bt16] = both(rnd({45, 70}, 3));
  CHECK(mm(a16, b16).dtype() == kBFloat16);
  CHECK(rel_error(mm(a16, b16), mm(a, b)) < kBf16Tol);
  CHECK(rel_error(mm(a16, bt16.t()), mm(a, bt.t())) < kBf16Tol);                 // transposed second operand
  CHECK(rel_error(mm(bt16, a16.t()), mm(bt, a.t())) < kBf16Tol);                 // transposed both ways
  CHECK(rel_error(mm(a16.t().contiguous().t(), b16), mm(a, b)) < kBf16Tol);      // transposed first operand
  CHECK(rel_error(mm(a16.narrow(0, 1, 7), b16), mm(a.narrow(0, 1, 7), b)) < kBf16Tol);  // an offset view
  {  // beta = 1 (linear's fused bias): out += a @ b
    Tensor out32 = rnd({33, 45}, 4), out16 = out32.to(kBFloat16);
    mm_kernel(DeviceType::CPU)(a, b, 1.0, out32);
    mm_kernel(DeviceType::CPU)(a16, b16, 1.0, out16);
    CHECK(rel_error(out16, out32) < kBf16Tol);
  }
  const auto [x, x16] = both(rnd({5, 9, 40}, 5));
  const auto [y, y16] = both(rnd({5, 40, 12}, 6));
  CHECK(rel_error(bmm(x16, y16), bmm(x, y)) < kBf16Tol);
  CHECK(rel_error(bmm(x16, y16.transpose(1, 2).contiguous().transpose(1, 2)), bmm(x, y)) < kBf16Tol);
  const auto [m, m16] = both(rnd({1, 40, 12}, 7));  // one matrix for the whole batch (batch stride 0)
  CHECK(rel_error(bmm(x16, m16.expand({5, 40, 12})), bmm(x, m.expand({5, 40, 12}))) < kBf16Tol);

  // linear, forward and every gradient, as autocast runs it (bfloat16 leaves here)
  auto run = [&](DType dtype) {
    Tensor in = leaf(rnd({16, 70}, 8), dtype), w = leaf(rnd({30, 70}, 9), dtype), bias = leaf(rnd({30}, 10), dtype);
    Tensor out = linear(in, w, bias);
    out.backward(rnd(out.shape(), 11, dtype));
    return std::vector<Tensor>{out, in.grad(), w.grad(), bias.grad()};
  };
  const std::vector<Tensor> want = run(kFloat32), got = run(kBFloat16);
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("linear output/input/weight/bias gradient #", i);
    CHECK(got[i].dtype() == kBFloat16);
    CHECK(rel_error(got[i], want[i]) < kBf16Tol);
  }
}
