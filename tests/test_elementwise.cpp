// Elementwise ops: forward values against hand-computed results, broadcasting rules,
// and gradients by finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "autograd/ops.h"
#include "gradcheck.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

TEST_CASE("binary ops broadcast like NumPy and match hand-computed values") {
  Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<float>({10, 20, 30}, {3});
  CHECK((a + b).tolist<float>() == std::vector<float>{11, 22, 33, 14, 25, 36});
  CHECK((a - b).tolist<float>() == std::vector<float>{-9, -18, -27, -6, -15, -24});
  CHECK((a * b).tolist<float>() == std::vector<float>{10, 40, 90, 40, 100, 180});
  Tensor col = from_vector<float>({2, 4}, {2, 1});
  CHECK((a / col).tolist<float>() == std::vector<float>{0.5f, 1, 1.5f, 1, 1.25f, 1.5f});
  CHECK(add(a, b, 2.0).tolist<float>() == std::vector<float>{21, 42, 63, 24, 45, 66});
  CHECK((a * 2.0).tolist<float>() == std::vector<float>{2, 4, 6, 8, 10, 12});
  CHECK((1.0 - a).tolist<float>() == std::vector<float>{0, -1, -2, -3, -4, -5});
}

TEST_CASE("broadcasting errors name both shapes") {
  Tensor a = zeros({2, 3});
  Tensor b = zeros({4});
  try {
    (void)(a + b);
    FAIL("expected an error");
  } catch (const Error& e) {
    std::string message = e.what();
    CHECK(message.find("[2, 3]") != std::string::npos);
    CHECK(message.find("[4]") != std::string::npos);
  }
  CHECK_THROWS_AS((void)(zeros({2}) + zeros({2}, kFloat64)), Error);
}

TEST_CASE("unary ops match std:: math") {
  std::vector<double> values = {-2.0, -0.5, 0.25, 1.5, 3.0};
  Tensor x = from_vector(values, {5});
  Tensor positive = x.abs() + 0.1;
  auto check = [&](const Tensor& got, auto fn, const Tensor& in) {
    auto g = got.tolist<double>();
    auto v = in.tolist<double>();
    for (size_t i = 0; i < v.size(); ++i) CHECK(g[i] == doctest::Approx(fn(v[i])).epsilon(1e-12));
  };
  check(x.exp(), [](double v) { return std::exp(v); }, x);
  check(positive.log(), [](double v) { return std::log(v); }, positive);
  check(positive.sqrt(), [](double v) { return std::sqrt(v); }, positive);
  check(positive.rsqrt(), [](double v) { return 1 / std::sqrt(v); }, positive);
  check(x.relu(), [](double v) { return v > 0 ? v : 0.0; }, x);
  check(x.sigmoid(), [](double v) { return 1 / (1 + std::exp(-v)); }, x);
  check(x.tanh(), [](double v) { return std::tanh(v); }, x);
  check(x.pow(3), [](double v) { return v * v * v; }, x);
  check(x.clamp(-1, 1), [](double v) { return std::min(1.0, std::max(-1.0, v)); }, x);
  check(-x, [](double v) { return -v; }, x);
}

TEST_CASE("comparisons return bool and where selects") {
  Tensor a = from_vector<float>({1, 5, 3}, {3});
  Tensor b = from_vector<float>({2, 5, 1}, {3});
  CHECK(lt(a, b).dtype() == kBool);
  CHECK(lt(a, b).tolist<bool>() == std::vector<bool>{true, false, false});
  CHECK(eq(a, b).tolist<bool>() == std::vector<bool>{false, true, false});
  CHECK(ge(a, b).tolist<bool>() == std::vector<bool>{false, true, true});
  CHECK(where(gt(a, b), a, b).tolist<float>() == std::vector<float>{2, 5, 3});
  CHECK(maximum(a, b).tolist<float>() == std::vector<float>{2, 5, 3});
  CHECK(minimum(a, b).tolist<float>() == std::vector<float>{1, 5, 1});
}

TEST_CASE("strided and broadcast operands take the general loop") {
  Tensor base = arange(0, 24, 1, kFloat32).reshape({2, 3, 4});
  Tensor t = base.transpose(0, 2);  // [4, 3, 2], non-contiguous
  Tensor doubled = t * 2.0;
  auto values = doubled.tolist<float>();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k) CHECK(values[(i * 3 + j) * 2 + k] == 2.0f * static_cast<float>(k * 12 + j * 4 + i));
  // Large enough to run on several OpenMP threads.
  Tensor big = ones({300, 257}).transpose(0, 1);
  CHECK((big + big).sum().item<float>() == doctest::Approx(2.0 * 300 * 257));
}

TEST_CASE("operands broadcast along the inner dim: one long row split, many short rows, mixed steps") {
  // Note [Broadcast scalars in the inner loop]: stride-0 operands are read from a filled
  // block; one long row is cut across threads. Every element is checked, at odd sizes
  // that leave partial blocks and partial splits.
  auto check_all = [](const Tensor& got, const std::function<double(int64_t)>& want) {
    auto values = got.to(kFloat64).tolist<double>();
    int64_t wrong = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) wrong += values[i] != want(i);
    CHECK(wrong == 0);
  };
  const int64_t n = 3 * 32768 + 77;  // a single row of over kGrain elements
  Tensor x = arange(0, static_cast<double>(n), 1, kFloat32);
  Tensor half = full({1}, 0.5, kFloat32).expand({n});
  check_all(x * half, [](int64_t i) { return 0.5 * static_cast<double>(i); });
  check_all(half - x, [](int64_t i) { return 0.5 - static_cast<double>(i); });  // the scalar first
  // Many short rows whose inner operand is broadcast: [rows, 3] - [rows, 1].
  Tensor rows = arange(0, 3.0 * 40000, 1, kFloat64).reshape({40000, 3});
  Tensor column = arange(0, 40000, 1, kFloat64).reshape({40000, 1});
  check_all(rows - column, [](int64_t i) { return static_cast<double>(i) - static_cast<double>(i / 3); });
  // A strided (transposed) operand keeps the general loop next to a broadcast one.
  Tensor t = arange(0, 6.0 * 7000, 1, kFloat64).reshape({6, 7000}).transpose(0, 1);  // [7000, 6]
  check_all(t + column.narrow(0, 0, 7000), [](int64_t i) {
    const int64_t r = i / 6, c = i % 6;
    return static_cast<double>(c * 7000 + r) + static_cast<double>(r);
  });
}

TEST_CASE("gradients of binary ops with broadcasting") {
  Tensor a = leaf({2, 3}, 1), b = leaf({3}, 2), c = leaf({2, 1}, 3);
  gradcheck([](const auto& in) { return in[0] + in[1]; }, {a, b});
  gradcheck([](const auto& in) { return sub(in[0], in[1], 0.5); }, {a, c});
  gradcheck([](const auto& in) { return in[0] * in[1]; }, {a, b});
  Tensor d = (leaf({3}, 4).abs() + 0.5).detach().requires_grad_(true);
  gradcheck([](const auto& in) { return in[0] / in[1]; }, {a, d});
  gradcheck([](const auto& in) { return maximum(in[0], in[1]); }, {a, b});
  gradcheck([](const auto& in) { return minimum(in[0], in[1]); }, {a, c});
  gradcheck([](const auto& in) { return where(gt(in[0], in[1]), in[0], in[1]); }, {a, b});
}

TEST_CASE("gradients of unary ops") {
  Tensor x = leaf({3, 4}, 5);
  Tensor positive = (x.detach().abs() + 0.5).requires_grad_(true);
  gradcheck([](const auto& in) { return -in[0]; }, {x});
  gradcheck([](const auto& in) { return in[0].exp(); }, {x});
  gradcheck([](const auto& in) { return in[0].log(); }, {positive});
  gradcheck([](const auto& in) { return in[0].sqrt(); }, {positive});
  gradcheck([](const auto& in) { return in[0].rsqrt(); }, {positive});
  gradcheck([](const auto& in) { return in[0].pow(3.0); }, {x});
  gradcheck([](const auto& in) { return in[0].pow(-1.5); }, {positive});
  gradcheck([](const auto& in) { return in[0].abs(); }, {x});
  gradcheck([](const auto& in) { return in[0].clamp(-0.5, 0.5); }, {x});
  gradcheck([](const auto& in) { return in[0].relu(); }, {x});
  gradcheck([](const auto& in) { return in[0].sigmoid(); }, {x});
  gradcheck([](const auto& in) { return in[0].tanh(); }, {x});
}

TEST_CASE("in-place ops mutate, bump the version, and refuse tensors that require grad") {
  Tensor t = zeros({3});
  uint32_t v0 = t.version();
  t.add_(ones({3}), 2.0);
  CHECK(t.tolist<float>() == std::vector<float>{2, 2, 2});
  t.mul_(1.5);
  CHECK(t.tolist<float>() == std::vector<float>{3, 3, 3});
  t.fill_(7);
  CHECK(t.tolist<float>() == std::vector<float>{7, 7, 7});
  t.zero_();
  CHECK(t.tolist<float>() == std::vector<float>{0, 0, 0});
  CHECK(t.version() == v0 + 4);
  Tensor p = ones({3}).requires_grad_(true);
  CHECK_THROWS_WITH_AS(p.add_(ones({3})), doctest::Contains("in-place"), Error);
  {
    NoGradGuard no_grad;
    p.add_(ones({3}));  // optimizer-style update is fine
  }
  CHECK(p.detach().tolist<float>() == std::vector<float>{2, 2, 2});
  CHECK_THROWS_WITH_AS(t.add_(ones({2, 3})), doctest::Contains("does not fit"), Error);
}

TEST_CASE("in-place writes into expanded or overlapping memory are refused (Note [In-place writes must not overlap])") {
  Tensor base = zeros({3});
  CHECK_THROWS_WITH_AS(base.expand({2, 3}).add_(ones({2, 3})),
                       doctest::Contains("more than one element of the written-to tensor refers to a single memory "
                                         "location (dim 0 of [2, 3] is expanded"),
                       Error);
  CHECK_THROWS_WITH_AS(base.expand({2, 3}).fill_(1), doctest::Contains("is expanded, stride 0"), Error);
  CHECK(base.tolist<float>() == std::vector<float>{0, 0, 0});  // nothing was written
  Tensor a = arange(0, 6, 1, kFloat32);
  CHECK_THROWS_WITH_AS(a.slice(0, 1, 6).add_(a.slice(0, 0, 5)),
                       doctest::Contains("some elements of the input and of the written-to tensor refer to the same "
                                         "memory location (elements [0, 5) and [1, 6)"),
                       Error);
  CHECK_THROWS_WITH_AS(a.slice(0, 0, 3).copy_(a.slice(0, 2, 5)), doctest::Contains("pass a clone() of the input"),
                       Error);
  // The tensor itself, a disjoint part of the same storage, and a clone are fine.
  a.add_(a);
  CHECK(a.tolist<float>() == std::vector<float>{0, 2, 4, 6, 8, 10});
  a.slice(0, 3, 6).copy_(a.slice(0, 0, 3));
  CHECK(a.tolist<float>() == std::vector<float>{0, 2, 4, 0, 2, 4});
  a.slice(0, 1, 6).add_(a.slice(0, 0, 5).clone());
  CHECK(a.tolist<float>() == std::vector<float>{0, 2, 6, 4, 2, 6});
}
