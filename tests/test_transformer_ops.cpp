// The transformer's functions: layer_norm, gelu, softmax over any dim and
// scaled_dot_product_attention. Forward against references written out here (or, for
// attention, against its composition matmul -> softmax -> matmul), gradients by float64
// finite differences, the fused attention kernel with small blocks against the
// composition's gradients, and the errors bad arguments get.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "autograd/ops.h"                  // declares: layer_norm, gelu, softmax, scaled_dot_product_attention
#include "core/allocator.h"                // defines: memory_stats
#include "core/cpu/transformer_kernels.h"  // declares: flash_attention_forward / _backward, AttentionBlocks
#include "core/cpu/vector_math.h"          // defines: exp_f32, erfc_f32
#include "tensor_compare.h"                // defines: max_abs_diff
#include "gradcheck.h"                     // defines: gradcheck, leaf

using namespace loom;
using loom::cpu::erfc_f32;
using loom::cpu::exp_f32;
using loom::testing::gradcheck;
using loom::testing::leaf;
using loom::testing::max_abs_diff;

namespace {

// The composition scaled_dot_product_attention's fused kernel must equal.
Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& additive_mask,
                           double scale) {
  Tensor scores = matmul(q, k.transpose(-2, -1)) * scale;
  if (additive_mask.defined()) scores = scores + additive_mask;
  return matmul(softmax(scores, -1), v);
}

Tensor causal_additive(int64_t L, int64_t S) {
  std::vector<double> m(static_cast<size_t>(L * S));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < S; ++j) m[static_cast<size_t>(i * S + j)] = j <= i ? 0 : -INFINITY;
  return from_vector<double>(m, {L, S});
}

}  // namespace

TEST_CASE("layer_norm normalises the trailing dims as PyTorch: biased variance, eps inside the root") {
  Tensor x = leaf({2, 3, 4}, 1, 3.0);
  Tensor w = leaf({4}, 2), b = leaf({4}, 3);
  Tensor y = layer_norm(x, {4}, w, b, 1e-5);
  Tensor mu = mean(x, {2}, true), var_b = var(x, {2}, /*unbiased=*/false, true);
  Tensor want = (x - mu) / sqrt(var_b + 1e-5) * w + b;
  CHECK(max_abs_diff(y, want) < 1e-12);
  // Over the last two dims, no affine.
  Tensor y2 = layer_norm(x, {3, 4});
  Tensor mu2 = mean(x, {1, 2}, true), var2 = var(x, {1, 2}, false, true);
  CHECK(max_abs_diff(y2, (x - mu2) / sqrt(var2 + 1e-5)) < 1e-12);
}

TEST_CASE("layer_norm gradients: input, weight and bias by finite differences (float64)") {
  Tensor x = leaf({3, 2, 5}, 4, 2.0), w = leaf({5}, 5), b = leaf({5}, 6);
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], {5}, in[1], in[2]); }, {x, w, b});
  Tensor w2 = leaf({2, 5}, 7), b2 = leaf({2, 5}, 8);
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], {2, 5}, in[1], in[2], 1e-3); }, {x, w2, b2});
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], {5}); }, {x});
  // A non-contiguous input (transposed) takes the same path.
  Tensor xt = leaf({5, 3}, 9);
  gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0].t(), {5}, in[1]); }, {xt, leaf({5}, 10)});
}

TEST_CASE("layer_norm refuses shapes that do not match normalized_shape") {
  Tensor x = zeros({2, 3, 4}, kFloat64);
  CHECK_THROWS_WITH_AS(layer_norm(x, {3}), doctest::Contains("expected input with shape [*, [3]]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, zeros({3}, kFloat64)), doctest::Contains("expected weight of shape [4]"),
                       Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {}), doctest::Contains("at least 1-dimensional"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, {4}, zeros({4}, kFloat32)), doctest::Contains("same dtype"), Error);
}

TEST_CASE("gelu exact and tanh: values, gradients, and the approximate argument") {
  Tensor x = from_vector<double>({-2.0, -0.5, 0.0, 1.0, 3.0}, {5});
  auto exact = gelu(x).tolist<double>();
  auto approx = gelu(x, "tanh").tolist<double>();
  for (size_t i = 0; i < exact.size(); ++i) {
    const double v = x.tolist<double>()[i];
    CHECK(exact[i] == doctest::Approx(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))).epsilon(1e-14));
    const double u = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
    CHECK(approx[i] == doctest::Approx(0.5 * v * (1 + std::tanh(u))).epsilon(1e-14));
  }
  CHECK(exact[3] == doctest::Approx(0.8413447460685429).epsilon(1e-15));  // torch.nn.functional.gelu(1.)
  CHECK(approx[3] == doctest::Approx(0.8411919906082768).epsilon(1e-15));
  gradcheck([](const std::vector<Tensor>& in) { return gelu(in[0]); }, {leaf({3, 4}, 11, 2.0)});
  gradcheck([](const std::vector<Tensor>& in) { return gelu(in[0], "tanh"); }, {leaf({3, 4}, 12, 2.0)});
  CHECK_THROWS_WITH_AS(gelu(x, "erf"), doctest::Contains("\"none\" or \"tanh\", got \"erf\""), Error);
}

// Note [Vectorisable exp and erf] (core/cpu/vector_math.h): float32 GELU and attention's
// exp run on loom's own exp and erfc. Against float64 truth over the range a network
// sees, the far negative tail included (where 1 + erf(x) would cancel to 0).
TEST_CASE("float32 exp, erfc and GELU: within float32's reach of float64, tails and special values") {
  double worst_exp_ulp = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.00731f) {
    const double want = std::exp(static_cast<double>(x));
    const double ulp = std::nextafter(static_cast<float>(want), INFINITY) - static_cast<float>(want);
    worst_exp_ulp = std::max(worst_exp_ulp, std::fabs(exp_f32(x) - want) / ulp);
  }
  CHECK(worst_exp_ulp <= 2.0);
  CHECK(exp_f32(-INFINITY) == 0.0f);
  CHECK(exp_f32(-100.0f) == 0.0f);
  CHECK(exp_f32(100.0f) == INFINITY);
  CHECK(std::isnan(exp_f32(NAN)));
  CHECK(exp_f32(0.0f) == 1.0f);
  CHECK(erfc_f32(INFINITY) == 0.0f);
  CHECK(erfc_f32(-INFINITY) == 2.0f);
  CHECK(std::isnan(erfc_f32(NAN)));

  std::vector<double> grid;
  for (double x = -9.0; x <= 9.0; x += 0.0037) grid.push_back(x);
  const int64_t n = static_cast<int64_t>(grid.size());
  Tensor x64 = from_vector<double>(grid, {n}).requires_grad_(true);
  Tensor x32 = x64.detach().to(kFloat32).requires_grad_(true);
  Tensor want = gelu(x64), got = gelu(x32);
  want.sum().backward();
  got.sum().backward();
  const auto w = want.tolist<double>(), g = got.to(kFloat64).tolist<double>();
  const auto dw = x64.grad().tolist<double>(), dg = x32.grad().to(kFloat64).tolist<double>();
  double worst_value = 0, worst_grad = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    worst_value = std::max(worst_value, std::fabs(g[i] - w[i]) / std::fabs(w[i]));
    // The derivative crosses 0 near x = -0.75: relative to at least 1e-2 there.
    worst_grad = std::max(worst_grad, std::fabs(dg[i] - dw[i]) / std::max(std::fabs(dw[i]), 1e-2));
  }
  CHECK(worst_value < 2e-5);  // std::erf's 1 + erf(x) form: 1.0 (0 for x < -5.9)
  CHECK(worst_grad < 2e-5);
}

TEST_CASE("softmax over a middle dim: gradients by finite differences") {
  gradcheck([](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, {leaf({2, 3, 4}, 13)});
  gradcheck([](const std::vector<Tensor>& in) { return log_softmax(in[0], 0); }, {leaf({2, 3, 4}, 14)});
}

TEST_CASE("scaled_dot_product_attention equals its composition: no mask, causal, bool and additive masks") {
  Tensor q = leaf({2, 3, 5, 4}, 21), k = leaf({2, 3, 7, 4}, 22), v = leaf({2, 3, 7, 6}, 23);
  const double scale = 0.5;  // 1 / sqrt(4), the default
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v), reference_attention(q, k, v, Tensor(), scale)) < 1e-12);
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, Tensor(), 0.0, false, 0.3),
                     reference_attention(q, k, v, Tensor(), 0.3)) < 1e-12);
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, Tensor(), 0.0, /*is_causal=*/true),
                     reference_attention(q, k, v, causal_additive(5, 7), scale)) < 1e-12);
  // A bool mask per batch, broadcast over heads: [2, 1, 5, 7]; every row keeps key 0.
  Tensor keep = gt(randn({2, 1, 5, 7}, kFloat64), zeros({}, kFloat64));
  keep = where(eq(arange(7).reshape({1, 1, 1, 7}), zeros({}, kInt64)), ones({}, kBool), keep);
  Tensor additive = where(keep, zeros({}, kFloat64), full({}, -INFINITY, kFloat64));
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, keep), reference_attention(q, k, v, additive, scale)) <
        1e-12);
  Tensor bias = randn({5, 7}, kFloat64);  // an additive [L, S] mask (a relative-position bias)
  CHECK(max_abs_diff(scaled_dot_product_attention(q, k, v, bias), reference_attention(q, k, v, bias, scale)) < 1e-12);
}

TEST_CASE("scaled_dot_product_attention gradients by finite differences: q, k, v with and without masks") {
  Tensor q = leaf({2, 4, 3}, 31), k = leaf({2, 5, 3}, 32), v = leaf({2, 5, 2}, 33);
  gradcheck([](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
            {q, k, v});
  gradcheck([](const std::vector<Tensor>& in) {
    return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, /*is_causal=*/true);
  }, {q, k, v});
  Tensor bias = randn({4, 5}, kFloat64);
  gradcheck([&](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], bias); },
            {q, k, v});
  // A mask that requires grad takes the math path (Note [Which attention runs]): its gradient too.
  Tensor trainable_bias = leaf({4, 5}, 34);
  gradcheck([](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2], in[3]); },
            {q, k, v, trainable_bias});
}

TEST_CASE("the fused kernel with blocks smaller than the sequence: outputs and gradients equal the composition") {
  // 11 queries and 13 keys in blocks of 3 and 4: partial blocks at both ends, the online
  // softmax rescaling across 4 key blocks, and causal blocks skipped and cut.
  const int64_t N = 3, L = 11, S = 13, E = 5, Ev = 4;
  for (const bool causal : {false, true}) {
    for (const bool with_mask : {false, true}) {
      CAPTURE(causal);
      CAPTURE(with_mask);
      if (causal && with_mask) continue;
      Tensor q = leaf({N, L, E}, 41), k = leaf({N, S, E}, 42), v = leaf({N, S, Ev}, 43);
      Tensor mask = with_mask ? randn({L, S}, kFloat64) : Tensor();
      Tensor additive = causal ? causal_additive(L, S) : mask;
      const double scale = 0.37;
      Tensor want = reference_attention(q, k, v, additive, scale);
      Tensor grad_out = randn({N, L, Ev}, kFloat64);
      sum(want * grad_out).backward();

      const cpu::AttentionBlocks blocks{3, 4};
      Tensor out = empty({N, L, Ev}, kFloat64), lse = empty({N, L}, kFloat64);
      Tensor kernel_mask = with_mask ? mask.expand({N, L, S}) : Tensor();
      cpu::flash_attention_forward(q.detach(), k.detach(), v.detach(), kernel_mask, causal, scale, out, lse, blocks);
      CHECK(max_abs_diff(out, want) < 1e-12);
      Tensor gq = empty({N, L, E}, kFloat64), gk = empty({N, S, E}, kFloat64), gv = empty({N, S, Ev}, kFloat64);
      cpu::flash_attention_backward(grad_out, q.detach(), k.detach(), v.detach(), kernel_mask, causal, scale, out, lse,
                                    gq, gk, gv, blocks);
      CHECK(max_abs_diff(gq, q.grad()) < 1e-12);
      CHECK(max_abs_diff(gk, k.grad()) < 1e-12);
      CHECK(max_abs_diff(gv, v.grad()) < 1e-12);
    }
  }
}

// Note [Attention reads the heads in place]: MultiheadAttention's heads are [N, H, L, E]
// transposes of [N, L, H, E] rows. The kernel reads them where they lie and writes the
// output in their layout; the values are those of the same attention on dense copies.
TEST_CASE("attention on transposed heads: read in place, output in their layout, the values of dense copies") {
  const int64_t N = 2, H = 3, L = 5, S = 7, E = 4;
  for (const bool causal : {false, true}) {
    for (const bool with_mask : {false, true}) {
      CAPTURE(causal);
      CAPTURE(with_mask);
      if (causal && with_mask) continue;
      // The projections' outputs [N, L, H, E], viewed as heads [N, H, L, E].
      Tensor q_rows = leaf({N, L, H, E}, 71), k_rows = leaf({N, S, H, E}, 72), v_rows = leaf({N, S, H, E}, 73);
      Tensor q = q_rows.transpose(1, 2), k = k_rows.transpose(1, 2), v = v_rows.transpose(1, 2);
      REQUIRE_FALSE(q.is_contiguous());
      Tensor mask = with_mask ? randn({N, 1, L, S}, kFloat64) : Tensor();  // per batch, broadcast over heads
      Tensor out = scaled_dot_product_attention(q, k, v, mask, 0.0, causal);
      CHECK(out.transpose(1, 2).is_contiguous());  // [N, L, H, E] in memory: MultiheadAttention's view back
      Tensor grad_out = randn({N, L, H, E}, kFloat64);
      sum(out.transpose(1, 2) * grad_out).backward();

      Tensor qd = q.detach().contiguous().requires_grad_(true), kd = k.detach().contiguous().requires_grad_(true);
      Tensor vd = v.detach().contiguous().requires_grad_(true);
      Tensor want = scaled_dot_product_attention(qd, kd, vd, mask, 0.0, causal);
      sum(want.transpose(1, 2) * grad_out).backward();
      CHECK(max_abs_diff(out, want) == 0);
      CHECK(max_abs_diff(q_rows.grad().transpose(1, 2), qd.grad()) == 0);
      CHECK(max_abs_diff(k_rows.grad().transpose(1, 2), kd.grad()) == 0);
      CHECK(max_abs_diff(v_rows.grad().transpose(1, 2), vd.grad()) == 0);
    }
  }
}

TEST_CASE("scaled_dot_product_attention in float32 agrees with float64 to float32's precision") {
  Tensor q = leaf({4, 65, 64}, 51), k = leaf({4, 65, 64}, 52), v = leaf({4, 65, 64}, 53);  // ViT-tiny's head
  Tensor want = scaled_dot_product_attention(q, k, v);
  Tensor got = scaled_dot_product_attention(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32));
  CHECK(max_abs_diff(got.to(kFloat64), want) < 1e-5);
}

TEST_CASE("a row whose every key is masked gives NaN, as softmax over nothing does, and no gradient to k and v") {
  Tensor q = leaf({1, 2, 3}, 61), k = leaf({1, 3, 3}, 62), v = leaf({1, 3, 3}, 63);
  Tensor keep = gt(from_vector<double>({1, 0, 1, 0, 0, 0}, {2, 3}), zeros({}, kFloat64));
  Tensor out = scaled_dot_product_attention(q, k, v, keep);
  auto values = out.tolist<double>();
  CHECK(!std::isnan(values[0]));
  CHECK(std::isnan(values[3]));
  sum(narrow(out, 1, 0, 1)).backward();  // the first row only: the masked one sends nothing
  CHECK(!std::isnan(sum(k.grad()).item<double>()));
  CHECK(!std::isnan(sum(v.grad()).item<double>()));
}

TEST_CASE("scaled_dot_product_attention says what it expected: mask shapes, dims, causal with a mask") {
  Tensor q = zeros({2, 3, 5, 4}), k = zeros({2, 3, 7, 4}), v = zeros({2, 3, 7, 6});
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, zeros({5, 6})),
                       doctest::Contains("expected attn_mask broadcastable to the attention's shape [2, 3, 5, 7]"),
                       Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, zeros({3, 2, 5, 7})),
                       doctest::Contains("got [3, 2, 5, 7]"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, zeros({5, 7}, kInt64)),
                       doctest::Contains("dtype bool"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, zeros({5, 7}), 0.0, true),
                       doctest::Contains("not both"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, zeros({2, 3, 7, 3}), v),
                       doctest::Contains("embedding dim to equal query's (4)"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, zeros({2, 3, 6, 6})),
                       doctest::Contains("as many rows as key (S = 7)"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, zeros({2, 7, 4}), v), doctest::Contains("of one rank"), Error);
  CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, Tensor(), 1.0), doctest::Contains("[0, 1)"), Error);
}

TEST_CASE("attention dropout takes the math path: p of the weights dropped, the rest scaled") {
  Tensor q = zeros({1, 4, 2}), k = zeros({1, 8, 2});  // uniform attention: weights 1/8
  Tensor v = ones({1, 8, 1});
  Generator gen(5);
  Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), 0.5, false, std::nullopt, &gen);
  // Each output is (kept weights) * 2 / 8: a multiple of 1/4 between 0 and 2.
  for (double x : out.tolist<float>()) CHECK(std::abs(x * 4 - std::round(x * 4)) < 1e-6);
}

TEST_CASE("the fused kernel keeps no attention matrix for backward; the composition keeps two") {
  // What stays allocated between forward and backward: the graph's saved tensors and the output.
  const int64_t N = 2, L = 512, E = 16;
  const int64_t matrix_bytes = N * L * L * 4;  // one [N, L, S] float32 matrix: 2 MiB
  Tensor q = randn({N, L, E}).requires_grad_(true), k = randn({N, L, E}).requires_grad_(true);
  Tensor v = randn({N, L, E}).requires_grad_(true);
  auto kept_by = [&](const std::function<Tensor()>& forward) {
    const int64_t before = memory_stats(Device()).allocated_bytes;
    Tensor out = forward();
    const int64_t kept = memory_stats(Device()).allocated_bytes - before;
    sum(out).backward();
    return kept;
  };
  const int64_t fused = kept_by([&] { return scaled_dot_product_attention(q, k, v); });
  MESSAGE("kept from forward to backward: fused ", fused, " bytes");
  CHECK(fused < matrix_bytes / 8);  // out [N, L, E] and lse [N, L]: 68 KiB
  // A mask that requires grad takes the composition (Note [Which attention runs]).
  Tensor bias = zeros({L, L}).requires_grad_(true);
  const int64_t composed = kept_by([&] { return scaled_dot_product_attention(q, k, v, bias); });
  MESSAGE("kept from forward to backward: composition ", composed, " bytes");
  CHECK(composed >= 2 * matrix_bytes);
}
