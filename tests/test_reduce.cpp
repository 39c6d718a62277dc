// Reductions: values against naive loops for every layout path (Note [Reduction
// layouts]), keepdim, and gradients by finite differences.
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/ops.h"
#include "gradcheck.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

namespace {
// Naive sum of a [A, B, C] float64 tensor over a mask of dims, by index arithmetic.
std::vector<double> naive_sum(const std::vector<double>& v, int64_t A, int64_t B, int64_t C, bool ra, bool rb, bool rc) {
  int64_t oa = ra ? 1 : A, ob = rb ? 1 : B, oc = rc ? 1 : C;
  std::vector<double> out(static_cast<size_t>(oa * ob * oc), 0.0);
  for (int64_t a = 0; a < A; ++a)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        out[static_cast<size_t>(((ra ? 0 : a) * ob + (rb ? 0 : b)) * oc + (rc ? 0 : c))] += v[static_cast<size_t>((a * B + b) * C + c)];
  return out;
}
}  // namespace

TEST_CASE("sum over every subset of dims matches a naive loop") {
  const int64_t A = 5, B = 7, C = 300;
  Tensor x = leaf({A, B, C}, 11).detach();
  auto values = x.tolist<double>();
  for (int mask = 1; mask < 8; ++mask) {
    bool ra = mask & 1, rb = mask & 2, rc = mask & 4;
    Shape dims;
    if (ra) dims.push_back(0);
    if (rb) dims.push_back(1);
    if (rc) dims.push_back(-1);
    auto expected = naive_sum(values, A, B, C, ra, rb, rc);
    auto got = x.sum(dims, /*keepdim=*/true).tolist<double>();
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
  }
  CHECK(x.sum({0, 2}).shape() == Shape{B});
  CHECK(x.sum({0, 2}, true).shape() == Shape{1, B, 1});
  CHECK(x.sum().shape() == Shape{});
}

TEST_CASE("reductions of strided views equal reductions of their copies") {
  Tensor x = leaf({6, 4, 9}, 3).detach();
  Tensor t = x.permute({2, 0, 1});  // non-contiguous
  Tensor c = t.contiguous();
  for (Shape dims : {Shape{0}, Shape{1}, Shape{2}, Shape{0, 2}, Shape{1, 2}}) {
    auto a = t.sum(dims).tolist<double>();
    auto b = c.sum(dims).tolist<double>();
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
  }
}

TEST_CASE("mean, var, max, min and argmax") {
  Tensor x = from_vector<double>({1, 5, 2, 8, 3, 3}, {2, 3});
  CHECK(x.mean().item<double>() == doctest::Approx(22.0 / 6));
  CHECK(x.mean({1}).tolist<double>() == std::vector<double>{8.0 / 3, 14.0 / 3});
  // Row 0: 1, 5, 2 -> mean 8/3, squared deviations sum 78/9; unbiased / 2, biased / 3.
  CHECK(x.var({1}).tolist<double>()[0] == doctest::Approx(78.0 / 9 / 2));
  CHECK(x.var({1}, false).tolist<double>()[0] == doctest::Approx(78.0 / 9 / 3));
  CHECK(x.max().item<double>() == 8);
  CHECK(x.min().item<double>() == 1);
  auto [values, indices] = max(x, 1);
  CHECK(values.tolist<double>() == std::vector<double>{5, 8});
  CHECK(indices.tolist<int64_t>() == std::vector<int64_t>{1, 0});
  CHECK(min(x, 0).second.tolist<int64_t>() == std::vector<int64_t>{0, 1, 0});
  CHECK(x.argmax(1, true).shape() == Shape{2, 1});
  // A large float32 sum accumulates in double: 10^6 ones are exactly 10^6.
  CHECK(ones({1000, 1000}).sum().item<float>() == 1e6f);
  Tensor ints = from_vector<int64_t>({1, 2, 3, 4}, {2, 2});
  CHECK(ints.sum({0}).tolist<int64_t>() == std::vector<int64_t>{4, 6});
}

TEST_CASE("reduction errors") {
  CHECK_THROWS_WITH_AS(zeros({2, 3}).sum({2}), doctest::Contains("dimension out of range"), Error);
  CHECK_THROWS_WITH_AS(zeros({2, 3}).sum({1, -1}), doctest::Contains("more than once"), Error);
  CHECK_THROWS_WITH_AS(zeros({0}).max(), doctest::Contains("non-empty"), Error);
  CHECK_THROWS_AS(from_vector<int64_t>({1}, {1}).mean(), Error);
}

TEST_CASE("gradients of reductions") {
  Tensor x = leaf({3, 4, 5}, 9);
  gradcheck([](const auto& in) { return in[0].sum(); }, {x});
  gradcheck([](const auto& in) { return in[0].sum({0, 2}); }, {x});
  gradcheck([](const auto& in) { return in[0].sum({1}, true); }, {x});
  gradcheck([](const auto& in) { return in[0].mean({-1}); }, {x});
  gradcheck([](const auto& in) { return in[0].mean(); }, {x});
  gradcheck([](const auto& in) { return in[0].var({0, 2}); }, {x});
  gradcheck([](const auto& in) { return in[0].var({1}, false, true); }, {x});
  gradcheck([](const auto& in) { return in[0].max(); }, {x});
  gradcheck([](const auto& in) { return in[0].min(); }, {x});
  gradcheck([](const auto& in) { return max(in[0], 1).first; }, {x});
  gradcheck([](const auto& in) { return min(in[0], 2, true).first; }, {x});
  gradcheck([](const auto& in) { return in[0].transpose(0, 2).sum({1}); }, {x});
}

TEST_CASE("integers and bools sum in int64, as in PyTorch") {
  Tensor bytes = full({300}, 1, TensorOptions(kUInt8));
  CHECK(sum(bytes).dtype() == kInt64);
  CHECK(sum(bytes).item<int64_t>() == 300);  // not 300 mod 256
  Tensor flags = full({2, 3}, 1, TensorOptions(kBool));
  CHECK(sum(flags).item<int64_t>() == 6);
  CHECK(sum(flags, {1}).tolist<int64_t>() == std::vector<int64_t>{3, 3});
  CHECK(sum(full({4}, 1 << 30, TensorOptions(kInt32))).item<int64_t>() == int64_t(1) << 32);
}

TEST_CASE("max, min, argmax and maximum propagate NaN, as in PyTorch") {
  const double nan = std::nan("");
  for (DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype);
    Tensor x = from_vector<double>({1, nan, 2, nan}, {4}).to(dtype);
    CHECK(std::isnan(max(x).to(kFloat64).item<double>()));
    CHECK(std::isnan(min(x).to(kFloat64).item<double>()));
    CHECK(argmax(x, 0).item<int64_t>() == 1);  // the first NaN
    CHECK(max(x, 0).second.item<int64_t>() == 1);
    CHECK(min(x, 0).second.item<int64_t>() == 1);
    Tensor leading = from_vector<double>({nan, 5, 2}, {3}).to(dtype);
    CHECK(argmax(leading, 0).item<int64_t>() == 0);
    Tensor one = from_vector<double>({1, 1}, {2}).to(dtype), nans = from_vector<double>({nan, 3}, {2}).to(dtype);
    for (const Tensor& m : {maximum(one, nans), maximum(nans, one), minimum(one, nans), minimum(nans, one)}) {
      CHECK(std::isnan(m.to(kFloat64).tolist<double>()[0]));
    }
    CHECK(maximum(one, nans).to(kFloat64).tolist<double>()[1] == 3);
    Tensor plain = from_vector<double>({3, 1, 3}, {3}).to(dtype);
    CHECK(argmax(plain, 0).item<int64_t>() == 0);  // ties: the first, as before
  }
}

TEST_CASE("the gradient of max, min and maximum at a NaN goes to the NaN, and nowhere else") {
  const double nan = std::nan("");
  Tensor x = from_vector<double>({1, nan, 2}, {3}).requires_grad_(true);
  max(x).backward();
  const auto g = x.grad().tolist<double>();
  CHECK(g[0] == 0);
  CHECK(g[1] == 1);
  CHECK(g[2] == 0);
  Tensor a = from_vector<double>({nan, 1}, {2}).requires_grad_(true), b = from_vector<double>({3, 2}, {2}).requires_grad_(true);
  sum(maximum(a, b)).backward();
  CHECK(a.grad().tolist<double>() == std::vector<double>{1, 0});  // a's NaN was the output, then b's 2
  CHECK(b.grad().tolist<double>() == std::vector<double>{0, 1});
}

TEST_CASE("the max of infinities is infinite, not the largest finite value") {
  for (DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype);
    Tensor lows = full({3}, -INFINITY, TensorOptions(dtype)), highs = full({2, 3}, INFINITY, TensorOptions(dtype));
    CHECK(max(lows).to(kFloat64).item<double>() == -INFINITY);
    CHECK(min(highs).to(kFloat64).item<double>() == INFINITY);
    CHECK(max(highs, 1).first.to(kFloat64).tolist<double>() == std::vector<double>{INFINITY, INFINITY});
  }
}
