// batch_norm: forward against a naive double-precision reference, running-statistic
// updates against hand computation (momentum, unbiased variance, version bump),
// gradients in training and eval with and without affine parameters, the fused
// batch_norm_relu against the composition it replaces, errors, and an
// opt-in timing of the ResNet-sized case (run with --no-skip -tc="*timing*").
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "autograd/ops.h"
#include "gradcheck.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

namespace {

// y = (x - mean_c) / sqrt(var_c + eps) * w_c + b_c over an [N, C, S] layout, with the
// biased batch statistics when `mean` is empty.
std::vector<double> naive_batch_norm(const std::vector<double>& x, int64_t N, int64_t C, int64_t S,
                                     std::vector<double> mean, std::vector<double> var, const std::vector<double>& w,
                                     const std::vector<double>& b, double eps) {
  auto at = [&](int64_t n, int64_t c, int64_t s) { return static_cast<size_t>((n * C + c) * S + s); };
  if (mean.empty()) {
    mean.assign(static_cast<size_t>(C), 0.0);
    var.assign(static_cast<size_t>(C), 0.0);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t n = 0; n < N; ++n)
        for (int64_t s = 0; s < S; ++s) mean[c] += x[at(n, c, s)];
      mean[c] /= double(N * S);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t s = 0; s < S; ++s) var[c] += (x[at(n, c, s)] - mean[c]) * (x[at(n, c, s)] - mean[c]);
      var[c] /= double(N * S);
    }
  }
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < S; ++s)
        y[at(n, c, s)] = (x[at(n, c, s)] - mean[c]) / std::sqrt(var[c] + eps) * (w.empty() ? 1.0 : w[c]) +
                         (b.empty() ? 0.0 : b[c]);
  return y;
}

template <typename T>
void check_close(const std::vector<T>& got, const std::vector<double>& expected, double tol) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(double(got[i]) == doctest::Approx(expected[i]).epsilon(tol));
}

}  // namespace

TEST_CASE("training batch_norm normalises with the biased batch variance") {
  Tensor x = leaf({4, 3, 5, 5}, 1, 2.0).detach() + 3.0;
  Tensor w = from_vector<double>({0.5, -1.0, 2.0}, {3});
  Tensor b = from_vector<double>({0.1, 0.2, -0.3}, {3});
  auto xs = x.tolist<double>();
  check_close(batch_norm(x, Tensor(), Tensor(), w, b, true).tolist<double>(),
              naive_batch_norm(xs, 4, 3, 25, {}, {}, w.tolist<double>(), b.tolist<double>(), 1e-5), 1e-12);
  check_close(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-3).tolist<double>(),
              naive_batch_norm(xs, 4, 3, 25, {}, {}, {}, {}, 1e-3), 1e-12);
  // BatchNorm1d's [N, C] layout.
  Tensor x2 = leaf({6, 4}, 2).detach();
  check_close(batch_norm(x2, Tensor(), Tensor(), Tensor(), Tensor(), true).tolist<double>(),
              naive_batch_norm(x2.tolist<double>(), 6, 4, 1, {}, {}, {}, {}, 1e-5), 1e-12);
}

TEST_CASE("running statistics: momentum update with the unbiased variance, in place, version bumped") {
  // One channel holding 1, 2, 3, 4: mean 2.5, biased var 1.25, unbiased var 5/3.
  Tensor x = from_vector<float>({1, 2, 3, 4}, {2, 1, 1, 2});
  Tensor running_mean = zeros({1});
  Tensor running_var = ones({1});
  const uint32_t v_mean = running_mean.version(), v_var = running_var.version();
  Tensor y = batch_norm(x, running_mean, running_var, Tensor(), Tensor(), true, 0.1, 1e-5);
  CHECK(running_mean.item<float>() == doctest::Approx(0.1 * 2.5));
  CHECK(running_var.item<float>() == doctest::Approx(0.9 * 1.0 + 0.1 * 5.0 / 3.0));
  CHECK(running_mean.version() > v_mean);
  CHECK(running_var.version() > v_var);
  auto out = y.tolist<float>();
  for (int i = 0; i < 4; ++i) CHECK(out[i] == doctest::Approx((i + 1 - 2.5) / std::sqrt(1.25 + 1e-5)));
  // A second step compounds: running = 0.9 * running + 0.1 * batch.
  batch_norm(x, running_mean, running_var, Tensor(), Tensor(), true, 0.1, 1e-5);
  CHECK(running_mean.item<float>() == doctest::Approx(0.9 * 0.25 + 0.25));
  CHECK(running_var.item<float>() == doctest::Approx(0.9 * (0.9 + 0.5 / 3.0) + 0.5 / 3.0));
  // momentum = 1 replaces the statistics with the batch's.
  batch_norm(x, running_mean, running_var, Tensor(), Tensor(), true, 1.0, 1e-5);
  CHECK(running_mean.item<float>() == doctest::Approx(2.5));
  CHECK(running_var.item<float>() == doctest::Approx(5.0 / 3.0));
}

TEST_CASE("eval batch_norm uses the running statistics and leaves them alone") {
  Tensor x = leaf({3, 2, 4, 4}, 3).detach();
  Tensor running_mean = from_vector<double>({0.5, -1.0}, {2});
  Tensor running_var = from_vector<double>({2.0, 0.25}, {2});
  Tensor w = from_vector<double>({1.5, -0.5}, {2});
  Tensor b = from_vector<double>({0.0, 1.0}, {2});
  const uint32_t version = running_mean.version();
  Tensor y = batch_norm(x, running_mean, running_var, w, b, false);
  check_close(y.tolist<double>(),
              naive_batch_norm(x.tolist<double>(), 3, 2, 16, {0.5, -1.0}, {2.0, 0.25}, w.tolist<double>(),
                               b.tolist<double>(), 1e-5),
              1e-12);
  CHECK(running_mean.tolist<double>() == std::vector<double>{0.5, -1.0});
  CHECK(running_var.tolist<double>() == std::vector<double>{2.0, 0.25});
  CHECK(running_mean.version() == version);
  // Without running statistics, eval falls back to batch statistics (track_running_stats=False).
  check_close(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false).tolist<double>(),
              naive_batch_norm(x.tolist<double>(), 3, 2, 16, {}, {}, {}, {}, 1e-5), 1e-12);
}

TEST_CASE("float32 batch_norm on a ResNet-like shape matches the double reference") {
  // A large mean relative to the spread is where E[x^2] - E[x]^2 would lose the variance.
  Tensor x64 = leaf({16, 8, 12, 12}, 4).detach() * 0.1 + 100.0;
  Tensor x32 = x64.to(kFloat32);
  Tensor w = leaf({8}, 5).detach();
  Tensor b = leaf({8}, 6).detach();
  Tensor rm = zeros({8}), rv = ones({8});
  Tensor y = batch_norm(x32, rm, rv, w.to(kFloat32), b.to(kFloat32), true);
  // x32 holds x64 rounded to float; the reference uses exactly those values.
  auto xs = x32.to(kFloat64).tolist<double>();
  check_close(y.tolist<float>(), naive_batch_norm(xs, 16, 8, 144, {}, {}, w.tolist<double>(), b.tolist<double>(), 1e-5),
              2e-3);
  // Unbiased variance of 0.1 * N(0, 1) is about 0.01; the update is 0.9 + 0.1 * var.
  for (float v : rv.tolist<float>()) CHECK(v == doctest::Approx(0.9 + 0.001).epsilon(1e-3));
  for (float m : rm.tolist<float>()) CHECK(m == doctest::Approx(10.0).epsilon(1e-3));
}

TEST_CASE("a strided (channels-last) input normalises like its contiguous copy") {
  Tensor x = leaf({3, 5, 4, 2}, 14).detach().permute({0, 3, 1, 2});  // [3, 2, 5, 4], strided
  Tensor dense = x.contiguous();
  Tensor w = from_vector<double>({2.0, -1.0}, {2});
  check_close(batch_norm(x, Tensor(), Tensor(), w, Tensor(), true).tolist<double>(),
              batch_norm(dense, Tensor(), Tensor(), w, Tensor(), true).tolist<double>(), 1e-12);
  gradcheck([](const auto& in) { return batch_norm(in[0].permute({0, 3, 1, 2}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
            {leaf({3, 5, 4, 2}, 15)});
}

TEST_CASE("batch_norm gradients in training mode, affine and not") {
  Tensor x = leaf({3, 2, 3, 3}, 7);
  Tensor w = leaf({2}, 8);
  Tensor b = leaf({2}, 9);
  gradcheck([](const auto& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true); }, {x, w, b});
  gradcheck([](const auto& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); }, {x});
  Tensor running_mean = zeros({2}, kFloat64), running_var = ones({2}, kFloat64);
  gradcheck([&](const auto& in) { return batch_norm(in[0], running_mean, running_var, in[1], in[2], true); }, {x, w, b});
  Tensor x2 = leaf({5, 3}, 10);
  gradcheck([](const auto& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); }, {x2});
  // Only some inputs needing gradients.
  Tensor w_frozen = w.detach();
  gradcheck([&](const auto& in) { return batch_norm(in[0], Tensor(), Tensor(), w_frozen, in[1], true); }, {x, b});
}

TEST_CASE("batch_norm gradients in eval mode, affine and not") {
  Tensor x = leaf({3, 2, 3, 3}, 11);
  Tensor w = leaf({2}, 12);
  Tensor b = leaf({2}, 13);
  Tensor running_mean = from_vector<double>({0.3, -0.2}, {2});
  Tensor running_var = from_vector<double>({1.5, 0.5}, {2});
  gradcheck([&](const auto& in) { return batch_norm(in[0], running_mean, running_var, in[1], in[2], false); },
            {x, w, b});
  gradcheck([&](const auto& in) { return batch_norm(in[0], running_mean, running_var, Tensor(), Tensor(), false); },
            {x});
}

TEST_CASE("batch_norm_relu equals relu(batch_norm(x) + residual), values and gradients, to the bit") {
  // Note [Fused BatchNorm epilogue]: the fused op does the composition's arithmetic.
  Generator gen(21);
  const Tensor x0 = randn({4, 6, 5, 5}, {}, &gen), r0 = randn({4, 6, 5, 5}, {}, &gen);
  const Tensor w0 = randn({6}, {}, &gen), b0 = randn({6}, {}, &gen), grad = randn({4, 6, 5, 5}, {}, &gen);
  for (bool training : {true, false}) {
    for (bool with_residual : {false, true}) {
      CAPTURE(training);
      CAPTURE(with_residual);
      std::vector<std::vector<float>> results[2];
      for (int fused = 0; fused < 2; ++fused) {
        Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
        Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
        Tensor rm = from_vector<float>({0.1f, -0.2f, 0.3f, 0.f, 1.f, -1.f}, {6}), rv = ones({6}) * 0.5;
        Tensor residual = with_residual ? r : Tensor();
        Tensor y = fused ? batch_norm_relu(x, rm, rv, w, b, training, 0.1, 1e-5, residual)
                         : relu(with_residual ? batch_norm(x, rm, rv, w, b, training) + r
                                              : batch_norm(x, rm, rv, w, b, training));
        y.backward(grad);
        results[fused] = {y.tolist<float>(), x.grad().tolist<float>(), w.grad().tolist<float>(),
                          b.grad().tolist<float>(), rm.tolist<float>(), rv.tolist<float>()};
        if (with_residual) results[fused].push_back(r.grad().tolist<float>());
      }
      CHECK(results[0] == results[1]);
    }
  }
}

TEST_CASE("batch_norm_relu gradients, with and without a residual") {
  Tensor x = leaf({3, 2, 3, 3}, 31);
  Tensor w = leaf({2}, 32);
  Tensor b = leaf({2}, 33);
  Tensor r = leaf({3, 2, 3, 3}, 34);
  gradcheck([](const auto& in) { return batch_norm_relu(in[0], Tensor(), Tensor(), in[1], in[2], true); }, {x, w, b});
  gradcheck([](const auto& in) {
    return batch_norm_relu(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-5, in[3]);
  }, {x, w, b, r});
  Tensor running_mean = from_vector<double>({0.3, -0.2}, {2});
  Tensor running_var = from_vector<double>({1.5, 0.5}, {2});
  gradcheck([&](const auto& in) {
    return batch_norm_relu(in[0], running_mean, running_var, in[1], in[2], false, 0.1, 1e-5, in[3]);
  }, {x, w, b, r});
  // Only the residual needing a gradient still gets the masked one.
  Tensor x_frozen = x.detach();
  gradcheck([&](const auto& in) {
    return batch_norm_relu(x_frozen, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5, in[0]);
  }, {r});
  CHECK_THROWS_WITH_AS(batch_norm_relu(zeros({4, 3, 2, 2}), Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-5,
                                       zeros({4, 3, 2, 1})),
                       doctest::Contains("expected a residual of the input's shape [4, 3, 2, 2], got [4, 3, 2, 1]"),
                       Error);
}

TEST_CASE("batch_norm errors say what was expected and what came") {
  Tensor x = zeros({4, 3, 2, 2});
  CHECK_THROWS_WITH_AS(batch_norm(zeros({3}), Tensor(), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("expected an input of shape [N, C, ...] (at least 2-D), got [3]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, Tensor(), Tensor(), zeros({4}), Tensor(), true),
                       doctest::Contains("expected weight of shape [3] (one value per channel of input [4, 3, 2, 2]), got [4]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, zeros({3}), ones({3}), Tensor(), zeros({3}, kFloat64), true),
                       doctest::Contains("expected bias of dtype float32 on cpu:0 (the input's), got float64"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, zeros({3}), Tensor(), Tensor(), Tensor(), true),
                       doctest::Contains("running_mean and running_var must both be given"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(zeros({1, 3, 1, 1}), zeros({3}), ones({3}), Tensor(), Tensor(), true),
                       doctest::Contains("expected more than 1 value per channel when training, got input of shape [1, 3, 1, 1]"), Error);
  // Eval mode with one value per channel is fine (running statistics).
  CHECK(batch_norm(zeros({1, 3, 1, 1}), zeros({3}), ones({3}), Tensor(), Tensor(), false).shape() == Shape{1, 3, 1, 1});
  Tensor trainable = zeros({3}).requires_grad_(true);
  CHECK_THROWS_WITH_AS(batch_norm(x, trainable, ones({3}), Tensor(), Tensor(), true),
                       doctest::Contains("must not require grad"), Error);
}

TEST_CASE("timing: batch_norm forward + backward on [128, 64, 32, 32] float32" * doctest::skip()) {
  Tensor x = randn({128, 64, 32, 32}).requires_grad_(true);
  Tensor w = ones({64}).requires_grad_(true), b = zeros({64}).requires_grad_(true);
  Tensor rm = zeros({64}), rv = ones({64});
  Tensor grad = randn({128, 64, 32, 32});
  std::vector<double> fwd, total;
  for (int it = 0; it < 12; ++it) {
    x.set_grad(Tensor());  // time the op, not gradient accumulation into x.grad
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    auto t0 = std::chrono::steady_clock::now();
    Tensor y = batch_norm(x, rm, rv, w, b, true);
    auto t1 = std::chrono::steady_clock::now();
    y.backward(grad);
    auto t2 = std::chrono::steady_clock::now();
    fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    total.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(total.begin(), total.end());
  std::printf("batch_norm [128,64,32,32] f32: forward %.2f ms, forward+backward %.2f ms (median of 12)\n",
              fwd[fwd.size() / 2], total[total.size() / 2]);
}
