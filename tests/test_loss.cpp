// log_softmax / softmax, nll_loss, cross_entropy (with label smoothing) and dropout:
// values against references written here from PyTorch's definitions (and a few values
// computed by hand), gradients by finite differences, and the errors users see.
#include <doctest/doctest.h>

#include <cmath>

#include "autograd/ops.h"
#include "gradcheck.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

namespace {

// log_softmax of each row of a [rows, classes] array, in long double.
std::vector<double> naive_log_softmax_rows(const std::vector<double>& x, int64_t rows, int64_t classes) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    long double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<long double>(x[r * classes + c]));
    for (int64_t c = 0; c < classes; ++c) out[r * classes + c] = static_cast<double>(x[r * classes + c] - std::log(sum));
  }
  return out;
}

// PyTorch's weighted cross-entropy with label smoothing, term by term: per sample
// (1 - e) * w[t] * -lp[t] + e / C * sum_c w[c] * -lp[c], 0 for ignored targets; `mean`
// divides by the summed w[t] of non-ignored samples.
double naive_cross_entropy(const std::vector<double>& lp, int64_t N, int64_t C, const std::vector<int64_t>& target,
                           const std::vector<double>& w, Reduction reduction, int64_t ignore, double e,
                           std::vector<double>* per_sample = nullptr) {
  double total = 0, denominator = 0;
  for (int64_t i = 0; i < N; ++i) {
    double loss = 0;
    if (target[i] != ignore) {
      const double wt = w.empty() ? 1.0 : w[target[i]];
      double smooth = 0;
      for (int64_t c = 0; c < C; ++c) smooth += (w.empty() ? 1.0 : w[c]) * -lp[i * C + c];
      loss = (1 - e) * wt * -lp[i * C + target[i]] + e / double(C) * smooth;
      denominator += wt;
    }
    if (per_sample) per_sample->push_back(loss);
    total += loss;
  }
  return reduction == Reduction::Mean ? total / denominator : total;
}

void check_close(const std::vector<double>& got, const std::vector<double>& expected, double tol = 1e-12) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(tol));
}

}  // namespace

TEST_CASE("log_softmax matches a naive reference along the last and other dims") {
  Tensor x = leaf({4, 6}, 1, 3.0).detach();
  auto xs = x.tolist<double>();
  check_close(log_softmax(x, 1).tolist<double>(), naive_log_softmax_rows(xs, 4, 6));
  check_close(log_softmax(x, -1).tolist<double>(), naive_log_softmax_rows(xs, 4, 6));
  // Along dim 0: the same as the transposed problem, transposed back, and contiguous.
  Tensor along0 = log_softmax(x, 0);
  CHECK(along0.is_contiguous());
  auto xt = x.t().contiguous().tolist<double>();
  auto ref_t = naive_log_softmax_rows(xt, 6, 4);
  auto got = along0.tolist<double>();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 6; ++c) CHECK(got[r * 6 + c] == doctest::Approx(ref_t[c * 4 + r]).epsilon(1e-12));
  // A middle dim of a 3-D tensor, and a 0-d tensor (log_softmax of one value is 0).
  Tensor y = leaf({2, 3, 4}, 2).detach();
  Tensor via_permute = log_softmax(y.permute({0, 2, 1}), 2).permute({0, 2, 1});
  check_close(log_softmax(y, 1).tolist<double>(), via_permute.contiguous().tolist<double>());
  CHECK(log_softmax(scalar_tensor(3.0, kFloat64), 0).item<double>() == 0.0);
}

TEST_CASE("log_softmax is stable for large logits; softmax rows sum to one") {
  Tensor big = from_vector<float>({1000, 1001, 1002, -1000, 0, 1000}, {2, 3});
  auto lp = log_softmax(big, 1).tolist<float>();
  // [1000, 1001, 1002] behaves like [0, 1, 2]: log_softmax = [-2.40760596, -1.40760596, -0.40760596].
  CHECK(lp[0] == doctest::Approx(-2.40760596));
  CHECK(lp[1] == doctest::Approx(-1.40760596));
  CHECK(lp[2] == doctest::Approx(-0.40760596));
  CHECK(lp[5] == doctest::Approx(0.0));
  CHECK(std::isinf(lp[3]) == false);
  Tensor p = softmax(leaf({300, 70}, 3).detach().to(kFloat32), 1);  // many rows: the threaded path
  Tensor row_sums = p.sum({1});
  for (float s : row_sums.tolist<float>()) CHECK(s == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("log_softmax and softmax gradients on every dim") {
  Tensor x = leaf({3, 5}, 4);
  gradcheck([](const auto& in) { return log_softmax(in[0], 1); }, {x});
  gradcheck([](const auto& in) { return log_softmax(in[0], 0); }, {x});
  gradcheck([](const auto& in) { return softmax(in[0], 1); }, {x});
  gradcheck([](const auto& in) { return softmax(in[0], 0); }, {x});
  Tensor y = leaf({2, 3, 4}, 5);
  gradcheck([](const auto& in) { return log_softmax(in[0], 1); }, {y});
}

TEST_CASE("nll_loss values: each reduction, class weights, ignore_index") {
  Tensor lp = from_vector<double>({-1.0, -2.0, -3.0, -0.5, -1.5, -2.5, -0.1, -0.2, -0.3}, {3, 3});
  Tensor target = from_vector<int64_t>({2, 0, 1}, {3});
  CHECK(nll_loss(lp, target, Tensor(), Reduction::None).tolist<double>() == std::vector<double>{3.0, 0.5, 0.2});
  CHECK(nll_loss(lp, target, Tensor(), Reduction::Sum).item<double>() == doctest::Approx(3.7));
  CHECK(nll_loss(lp, target).item<double>() == doctest::Approx(3.7 / 3));
  Tensor w = from_vector<double>({1.0, 2.0, 0.5}, {3});
  check_close(nll_loss(lp, target, w, Reduction::None).tolist<double>(), {1.5, 0.5, 0.4});
  // The weighted mean divides by the summed weights of the targets: 0.5 + 1 + 2.
  CHECK(nll_loss(lp, target, w).item<double>() == doctest::Approx(2.4 / 3.5));
  // An ignored sample contributes nothing and leaves the denominator.
  Tensor ignoring = from_vector<int64_t>({2, -100, 1}, {3});
  check_close(nll_loss(lp, ignoring, w, Reduction::None).tolist<double>(), {1.5, 0.0, 0.4});
  CHECK(nll_loss(lp, ignoring, w).item<double>() == doctest::Approx(1.9 / 2.5));
  CHECK(nll_loss(lp, from_vector<int64_t>({2, 0, 1}, {3}), Tensor(), Reduction::Mean, 0).item<double>() ==
        doctest::Approx(3.2 / 2));
  // Every target ignored: the mean is 0 / 0, NaN, as in PyTorch.
  CHECK(std::isnan(nll_loss(lp, full({3}, -100, kInt64)).item<double>()));
  // One sample: input [C], target [].
  CHECK(nll_loss(from_vector<double>({-1, -2}, {2}), scalar_tensor(1, kInt64)).item<double>() == 2.0);
}

TEST_CASE("nll_loss gradients with weights, ignore_index and each reduction") {
  Tensor lp = leaf({5, 4}, 6);
  Tensor target = from_vector<int64_t>({3, 0, 1, 3, 2}, {5});
  Tensor ignoring = from_vector<int64_t>({3, 1, -100, 0, 1}, {5});
  Tensor w = from_vector<double>({0.5, 1.0, 2.0, 1.5}, {4});
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    gradcheck([&](const auto& in) { return nll_loss(in[0], target, Tensor(), r); }, {lp});
    gradcheck([&](const auto& in) { return nll_loss(in[0], target, w, r); }, {lp});
    gradcheck([&](const auto& in) { return nll_loss(in[0], ignoring, w, r); }, {lp});
    gradcheck([&](const auto& in) { return nll_loss(in[0], target, Tensor(), r, 3); }, {lp});
  }
}

TEST_CASE("cross_entropy is nll_loss of log_softmax, and label smoothing follows PyTorch") {
  // Hand-computed: logits [1, 2, 3], target 0, smoothing 0.1: lp = [-2.4076, -1.4076, -0.4076],
  // loss = 0.9 * 2.40760596 + 0.1 / 3 * 4.22281788 = 2.30760596.
  Tensor logits = from_vector<double>({1, 2, 3}, {1, 3});
  Tensor zero = from_vector<int64_t>({0}, {1});
  CHECK(cross_entropy(logits, zero).item<double>() == doctest::Approx(2.40760596));
  CHECK(cross_entropy(logits, zero, Tensor(), Reduction::Mean, -100, 0.1).item<double>() ==
        doctest::Approx(2.30760596));

  const int64_t N = 6, C = 5;
  Tensor x = leaf({N, C}, 7, 2.0).detach();
  auto lp = log_softmax(x, 1).tolist<double>();
  std::vector<int64_t> t = {4, 0, -100, 2, 2, 1};
  Tensor target = from_vector<int64_t>(t, {N});
  std::vector<double> wv = {0.5, 1.0, 2.0, 1.5, 0.25};
  Tensor w = from_vector<double>(wv, {C});
  for (double e : {0.0, 0.1, 0.35}) {
    for (bool weighted : {false, true}) {
      CAPTURE(e);
      CAPTURE(weighted);
      const std::vector<double> wr = weighted ? wv : std::vector<double>{};
      const Tensor wt = weighted ? w : Tensor();
      for (Reduction r : {Reduction::Mean, Reduction::Sum}) {
        CHECK(cross_entropy(x, target, wt, r, -100, e).item<double>() ==
              doctest::Approx(naive_cross_entropy(lp, N, C, t, wr, r, -100, e)).epsilon(1e-12));
      }
      std::vector<double> per_sample;
      naive_cross_entropy(lp, N, C, t, wr, Reduction::None, -100, e, &per_sample);
      check_close(cross_entropy(x, target, wt, Reduction::None, -100, e).tolist<double>(), per_sample);
    }
  }
}

TEST_CASE("cross_entropy gradients with label smoothing, weights and ignore_index") {
  Tensor x = leaf({5, 4}, 8);
  Tensor target = from_vector<int64_t>({3, 0, 1, 3, 2}, {5});
  Tensor ignoring = from_vector<int64_t>({3, -100, 1, 0, 2}, {5});
  Tensor w = from_vector<double>({0.5, 1.0, 2.0, 1.5}, {4});
  gradcheck([&](const auto& in) { return cross_entropy(in[0], target); }, {x});
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    gradcheck([&](const auto& in) { return cross_entropy(in[0], ignoring, w, r, -100, 0.2); }, {x});
    gradcheck([&](const auto& in) { return cross_entropy(in[0], target, Tensor(), r, -100, 0.1); }, {x});
  }
  Tensor one = leaf({4}, 9);
  gradcheck([&](const auto& in) { return cross_entropy(in[0], scalar_tensor(2, kInt64), w, Reduction::Mean, -100, 0.3); },
            {one});
}

TEST_CASE("loss errors name the bad value, the expected range and the position") {
  Tensor lp = zeros({3, 4});
  CHECK_THROWS_WITH_AS(nll_loss(lp, from_vector<int64_t>({0, 4, 1}, {3})),
                       doctest::Contains("target 4 at position 1 is out of bounds: expected a class index in [0, 4)"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(lp, from_vector<int64_t>({-1, 0, 1}, {3})),
                       doctest::Contains("target -1 at position 0 is out of bounds"), Error);
  CHECK_THROWS_WITH_AS(nll_loss(lp, zeros({3})), doctest::Contains("expected target of dtype int64 (class indices), got float32"), Error);
  CHECK_THROWS_WITH_AS(nll_loss(lp, zeros({4}, kInt64)),
                       doctest::Contains("expected target of shape [3] (one class index per row of input [3, 4]), got [4]"), Error);
  CHECK_THROWS_WITH_AS(nll_loss(zeros({2, 3, 4}), zeros({2}, kInt64)),
                       doctest::Contains("expected input of shape [N, C] (or [C] for one sample), got [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(nll_loss(lp, zeros({3}, kInt64), ones({3})),
                       doctest::Contains("expected weight of shape [4] (one per class), got [3]"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(lp, zeros({3}), Tensor(), Reduction::Mean, -100, 0.0),
                       doctest::Contains("class-probability targets are not supported"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(lp, zeros({3}, kInt64), Tensor(), Reduction::Mean, -100, 1.5),
                       doctest::Contains("expected label_smoothing between 0.0 and 1.0, got 1.5"), Error);
}

TEST_CASE("dropout: scaled mask, identity when not training, determinism for a seed") {
  Tensor x = ones({200, 100});
  Generator gen(42);
  Tensor y = dropout(x, 0.3, true, &gen);
  auto values = y.tolist<float>();
  int64_t kept = 0;
  for (float v : values) {
    CHECK((v == 0.0f || v == doctest::Approx(1.0 / 0.7)));
    kept += v != 0.0f;
  }
  // 20000 Bernoulli(0.7) draws: 14000 +- 65 (one sigma).
  CHECK(kept > 13600);
  CHECK(kept < 14400);
  // Same seed, same mask; the generator advanced, so a second draw differs.
  Generator again(42);
  CHECK(dropout(x, 0.3, true, &again).tolist<float>() == values);
  CHECK(dropout(x, 0.3, true, &again).tolist<float>() != values);
  CHECK(dropout(x, 0.3, false, &gen).is_same(x));
  CHECK(dropout(x, 0.0, true, &gen).is_same(x));
  CHECK(dropout(x, 1.0, true, &gen).sum().item<float>() == 0.0f);  // PyTorch: p = 1 drops everything
  // The default generator follows manual_seed.
  manual_seed(7);
  Tensor first = dropout(x, 0.5, true);
  manual_seed(7);
  CHECK(dropout(x, 0.5, true).tolist<float>() == first.tolist<float>());
}

TEST_CASE("dropout gradient is the saved mask") {
  Tensor x = leaf({6, 7}, 10);
  gradcheck([](const auto& in) {
    Generator gen(3);  // the same mask on every evaluation
    return dropout(in[0], 0.4, true, &gen);
  }, {x});
  Tensor z = leaf({50}, 11);
  Generator gen(5);
  Tensor y = dropout(z, 0.5, true, &gen);
  y.sum().backward();
  CHECK(z.grad().tolist<double>() == (y.detach() / z.detach()).tolist<double>());
  CHECK_THROWS_WITH_AS(dropout(x, 1.5, true), doctest::Contains("expected a probability p between 0 and 1, got 1.5"), Error);
  CHECK_THROWS_WITH_AS(dropout(x, -0.1, false), doctest::Contains("got -0.1"), Error);
}

TEST_CASE("a reduction that is not None, Mean or Sum is an error, not a loss of 0") {
  Tensor logits = randn({2, 3}), labels = randint(0, 3, {2});
  CHECK_THROWS_WITH_AS(cross_entropy(logits, labels, Tensor(), static_cast<Reduction>(7)),
                       doctest::Contains("reduction must be None, Mean or Sum, got the value 7"), Error);
}

TEST_CASE("softmax and log_softmax: an empty dim gives an empty result, an integer input a clear error") {
  CHECK(log_softmax(zeros({5, 0}), 1).shape() == Shape{5, 0});
  CHECK(softmax(zeros({0, 3}), 1).shape() == Shape{0, 3});
  CHECK_THROWS_WITH_AS(softmax(zeros({5}, kInt64), 0), doctest::Contains("softmax: expected a floating-point tensor"),
                       Error);
  CHECK_THROWS_WITH_AS(cross_entropy(zeros({2, 0}), zeros({2}, kInt64)), doctest::Contains("for 0 classes"), Error);
}
