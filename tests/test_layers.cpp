// Layers: forward against naive references on small cases, gradients by finite
// differences through the module (float64, parameters included), default
// initialisation, and nn::init.
#include <doctest/doctest.h>

#include <cmath>

#include "gradcheck.h"
#include "nn/nn.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

namespace {

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-10) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK_MESSAGE(std::abs(got[i] - want[i]) <= tol, "element ", i, ": ",
                                                        got[i], " vs ", want[i]);
}

// Gradient check of module(x) with respect to x and every parameter (float64).
void gradcheck_module(nn::Module& module, const Tensor& x) {
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : module.parameters()) inputs.push_back(p);
  gradcheck([&](const std::vector<Tensor>& in) { return module.forward(in[0]); }, inputs);
}

// Naive NCHW convolution on host vectors.
std::vector<double> naive_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, nn::Pair stride, nn::Pair pad,
                                 nn::Pair dil, int64_t groups) {
  auto xv = x.tolist<double>(), wv = w.tolist<double>();
  std::vector<double> bv = b.defined() ? b.tolist<double>() : std::vector<double>(w.size(0), 0.0);
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t O = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3);
  const int64_t OH = (H + 2 * pad.h - dil.h * (KH - 1) - 1) / stride.h + 1;
  const int64_t OW = (W + 2 * pad.w - dil.w * (KW - 1) - 1) / stride.w + 1;
  const int64_t Og = O / groups;
  std::vector<double> out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double acc = bv[o];
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                int64_t h = i * stride.h - pad.h + kh * dil.h, ww = j * stride.w - pad.w + kw * dil.w;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                acc += xv[((n * C + g * Cg + c) * H + h) * W + ww] * wv[((o * Cg + c) * KH + kh) * KW + kw];
              }
          out.push_back(acc);
        }
  (void)C;
  return out;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to(kFloat64).tolist<double>()) m = std::max(m, std::abs(v));
  return m;
}

}  // namespace

TEST_CASE("default initialisation is PyTorch's: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias") {
  manual_seed(0);
  nn::Conv2d conv(16, 32, 3);
  const double bound = 1.0 / std::sqrt(16.0 * 9.0);
  CHECK(conv.weight.shape() == Shape{32, 16, 3, 3});
  double sum_sq = 0;
  auto w = conv.weight.tolist<float>();
  for (float v : w) sum_sq += double(v) * v;
  CHECK(max_abs(conv.weight) <= bound);
  // The variance of U(-b, b) is b^2 / 3.
  CHECK(sum_sq / double(w.size()) == doctest::Approx(bound * bound / 3).epsilon(0.05));
  CHECK(max_abs(conv.bias) <= bound);

  nn::Linear fc(100, 10);
  CHECK(max_abs(fc.weight) <= 0.1 + 1e-7);
  CHECK(max_abs(fc.bias) <= 0.1 + 1e-7);
  CHECK(max_abs(fc.weight) > 0.09);  // and the interval is used, not a narrower one

  nn::Conv2d grouped(8, 8, 3, 1, 1, 1, /*groups=*/4, /*bias=*/false);
  CHECK(grouped.weight.shape() == Shape{8, 2, 3, 3});
  CHECK_FALSE(grouped.bias.defined());
  CHECK(grouped.named_parameters().keys() == std::vector<std::string>{"weight"});
  CHECK(grouped.state_dict().keys() == std::vector<std::string>{"weight"});

  manual_seed(7);
  nn::Linear a(5, 5);
  manual_seed(7);
  nn::Linear b(5, 5);
  CHECK(a.weight.tolist<float>() == b.weight.tolist<float>());  // seeded: reproducible
}

TEST_CASE("nn::init gains, fans and distributions") {
  CHECK(nn::init::calculate_gain("relu") == doctest::Approx(std::sqrt(2.0)));
  CHECK(nn::init::calculate_gain("leaky_relu", std::sqrt(5.0)) == doctest::Approx(std::sqrt(1.0 / 3)));
  CHECK(nn::init::calculate_gain("tanh") == doctest::Approx(5.0 / 3));
  CHECK(nn::init::calculate_gain("linear") == 1.0);
  CHECK_THROWS_WITH_AS(nn::init::calculate_gain("gelu"), doctest::Contains("unsupported nonlinearity"), Error);
  auto [fan_in, fan_out] = nn::init::calculate_fan_in_and_fan_out(zeros({64, 3, 3, 3}));
  CHECK(fan_in == 27);
  CHECK(fan_out == 576);
  CHECK_THROWS_AS(nn::init::calculate_fan_in_and_fan_out(zeros({5})), Error);

  Tensor t = empty({256, 128});
  nn::init::kaiming_normal_(t, 0, "fan_out", "relu");
  double sum_sq = 0;
  for (float v : t.tolist<float>()) sum_sq += double(v) * v;
  CHECK(std::sqrt(sum_sq / double(t.numel())) == doctest::Approx(std::sqrt(2.0 / 256)).epsilon(0.03));
  nn::init::kaiming_uniform_(t, 0, "fan_in", "relu");
  CHECK(max_abs(t) <= std::sqrt(6.0 / 128) + 1e-6);
  nn::init::constant_(t, 0.5);
  CHECK(t.tolist<float>()[100] == 0.5f);
  CHECK_THROWS_WITH_AS(nn::init::kaiming_normal_(t, 0, "fan_sideways"), doctest::Contains("fan_in"), Error);

  // Works on parameters (leaves requiring grad) and on strided views.
  Tensor p = zeros({4, 6}).requires_grad_(true);
  nn::init::ones_(p.detach().t());
  CHECK(p.detach().tolist<float>() == std::vector<float>(24, 1.0f));
  {
    nn::init::NoInitGuard skip;
    nn::init::zeros_(p);
  }
  CHECK(p.detach().tolist<float>() == std::vector<float>(24, 1.0f));
}

TEST_CASE("Conv2d forward matches a naive convolution (stride, padding, dilation, groups)") {
  struct Case {
    int64_t in, out;
    nn::Pair k, s, p, d;
    int64_t groups;
    bool bias;
  };
  for (const Case& c : {Case{3, 4, 3, 1, 1, 1, 1, true}, Case{4, 6, {3, 2}, 2, {1, 0}, 1, 2, true},
                        Case{2, 2, 3, 1, 2, 2, 1, false}}) {
    nn::Conv2d conv(c.in, c.out, c.k, c.s, c.p, c.d, c.groups, c.bias);
    conv.to(kFloat64);
    Tensor x = randn({2, c.in, 7, 6}, kFloat64);
    check_close(conv.forward(x).tolist<double>(), naive_conv2d(x, conv.weight, conv.bias, c.s, c.p, c.d, c.groups));
  }
  nn::Conv2d conv(3, 4, 3);
  CHECK_THROWS_WITH_AS(conv.forward(zeros({1, 2, 5, 5})), doctest::Contains("[N, 3, H, W]"), Error);
  CHECK_THROWS_WITH_AS(nn::Conv2d(3, 4, 3, 1, 0, 1, /*groups=*/2), doctest::Contains("divisible by groups"), Error);
}

TEST_CASE("Conv2d gradients by finite differences (input, weight, bias)") {
  nn::Conv2d conv(2, 3, 3, 2, 1, 1, 1, true);
  conv.to(kFloat64);
  gradcheck_module(conv, leaf({2, 2, 5, 5}, 11));
}

TEST_CASE("Linear forward and gradients") {
  nn::Linear fc(3, 2);
  fc.to(kFloat64);
  Tensor x = from_vector<double>({1, 2, 3, -1, 0, 4}, {2, 3});
  auto w = fc.weight.tolist<double>(), b = fc.bias.tolist<double>(), xv = x.tolist<double>();
  std::vector<double> want;
  for (int n = 0; n < 2; ++n)
    for (int o = 0; o < 2; ++o) want.push_back(b[o] + w[o * 3] * xv[n * 3] + w[o * 3 + 1] * xv[n * 3 + 1] + w[o * 3 + 2] * xv[n * 3 + 2]);
  check_close(fc.forward(x).tolist<double>(), want);
  gradcheck_module(fc, leaf({4, 3}, 3));
  nn::Linear no_bias(3, 2, false);
  no_bias.to(kFloat64);
  gradcheck_module(no_bias, leaf({4, 3}, 4));
  CHECK_THROWS_WITH_AS(fc.forward(zeros({2, 4}, kFloat64)), doctest::Contains("last dimension is 3"), Error);
}

TEST_CASE("BatchNorm2d training: batch statistics, running stats with unbiased variance, batch counter") {
  nn::BatchNorm2d bn(2);
  bn.to(kFloat64);
  Tensor x = from_vector<double>({1, 2, 3, 4, 10, 20, 30, 40, 5, 6, 7, 8, -10, -20, -30, -40}, {2, 2, 2, 2});
  Tensor y = bn.forward(x);
  // Channel 0 holds {1,2,3,4,5,6,7,8}: mean 4.5, biased var 5.25, unbiased 6.
  // Channel 1 holds {10,20,30,40,-10,-20,-30,-40}: mean 0, biased var 750, unbiased 857.142857...
  auto yv = y.tolist<double>();
  CHECK(yv[0] == doctest::Approx((1 - 4.5) / std::sqrt(5.25 + 1e-5)).epsilon(1e-9));
  CHECK(yv[4] == doctest::Approx(10 / std::sqrt(750 + 1e-5)).epsilon(1e-9));
  check_close(bn.running_mean.tolist<double>(), {0.1 * 4.5, 0.0});
  check_close(bn.running_var.tolist<double>(), {0.9 + 0.1 * 6.0, 0.9 + 0.1 * 6000.0 / 7.0}, 1e-9);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);
  bn.forward(x);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);
  check_close(bn.running_mean.tolist<double>(), {0.19 * 4.5, 0.0}, 1e-12);

  bn.eval();
  auto rm = bn.running_mean.tolist<double>(), rv = bn.running_var.tolist<double>();
  Tensor ye = bn.forward(x);
  CHECK(ye.tolist<double>()[0] == doctest::Approx((1 - rm[0]) / std::sqrt(rv[0] + 1e-5)).epsilon(1e-9));
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);  // eval does not count
  CHECK_THROWS_WITH_AS(bn.forward(zeros({2, 3, 2, 2}, kFloat64)), doctest::Contains("expected 2 channels"), Error);
  CHECK_THROWS_WITH_AS(bn.forward(zeros({2, 2}, kFloat64)), doctest::Contains("4D"), Error);
}

TEST_CASE("BatchNorm2d options: cumulative average, affine=false, no running stats") {
  nn::BatchNorm2d cumulative(1, 1e-5, std::nullopt);
  cumulative.to(kFloat64);
  cumulative.forward(full({2, 1, 1, 2}, 2.0, kFloat64));
  cumulative.forward(full({2, 1, 1, 2}, 4.0, kFloat64));
  // momentum = 1/1, then 1/2: the running mean is the average of the batch means.
  CHECK(cumulative.running_mean.item<double>() == doctest::Approx(3.0));

  nn::BatchNorm2d plain(3, 1e-5, 0.1, /*affine=*/false, /*track_running_stats=*/false);
  CHECK(plain.parameters().empty());
  CHECK(plain.buffers().empty());
  CHECK(plain.state_dict().empty());
  plain.eval();  // without running stats, eval normalises with batch statistics
  Tensor y = plain.forward(randn({4, 3, 2, 2}));
  CHECK(y.mean().item<float>() == doctest::Approx(0.0).epsilon(1e-5));
}

TEST_CASE("BatchNorm2d gradients by finite differences") {
  nn::BatchNorm2d bn(3);
  bn.to(kFloat64);
  {
    NoGradGuard no_grad;
    bn.weight.copy_(from_vector<double>({0.5, 1.5, -1.0}, {3}));
    bn.bias.copy_(from_vector<double>({0.1, 0.2, 0.3}, {3}));
  }
  gradcheck_module(bn, leaf({3, 3, 2, 2}, 5));
  bn.eval();
  gradcheck_module(bn, leaf({3, 3, 2, 2}, 6));
}

TEST_CASE("ReLU, Flatten, Identity") {
  Tensor x = from_vector<float>({-1, 2, -3, 4}, {1, 1, 2, 2});
  CHECK(nn::ReLU().forward(x).tolist<float>() == std::vector<float>{0, 2, 0, 4});
  CHECK(nn::Flatten().forward(x).shape() == Shape{1, 4});
  CHECK(nn::Flatten(0).forward(x).shape() == Shape{4});
  CHECK(nn::Identity().forward(x).is_same(x));
}

TEST_CASE("pooling layers match hand-computed windows") {
  Tensor x = arange(0, 16, 1, kFloat64).reshape({1, 1, 4, 4});
  CHECK(nn::MaxPool2d(2).forward(x).tolist<double>() == std::vector<double>{5, 7, 13, 15});
  CHECK(nn::MaxPool2d(3, 1).forward(x).tolist<double>() == std::vector<double>{10, 11, 14, 15});
  CHECK(nn::AvgPool2d(2).forward(x).tolist<double>() == std::vector<double>{2.5, 4.5, 10.5, 12.5});
  // Padding with count_include_pad: the corner window [0, 1; 4, 5] plus 5 zeros, over 9.
  CHECK(nn::AvgPool2d(3, 2, 1).forward(x).tolist<double>()[0] == doctest::Approx(10.0 / 9));
  CHECK(nn::AvgPool2d(3, 2, 1, false, /*count_include_pad=*/false).forward(x).tolist<double>()[0] ==
        doctest::Approx(2.5));
  CHECK(nn::AdaptiveAvgPool2d(1).forward(x).tolist<double>() == std::vector<double>{7.5});
  CHECK(nn::AdaptiveAvgPool2d(2).forward(x).tolist<double>() == std::vector<double>{2.5, 4.5, 10.5, 12.5});
  CHECK(nn::MaxPool2d(2).stride == nn::Pair(2));  // stride defaults to kernel_size
  gradcheck([](const auto& in) { return nn::AvgPool2d(2, 1).forward(in[0]); }, {leaf({1, 2, 3, 3}, 8)});
  gradcheck([](const auto& in) { return nn::AdaptiveAvgPool2d(1).forward(in[0]); }, {leaf({2, 2, 3, 3}, 9)});
  gradcheck([](const auto& in) { return nn::MaxPool2d(2).forward(in[0]); }, {leaf({1, 2, 4, 4}, 10)});
}

TEST_CASE("Dropout: identity in eval, Bernoulli mask scaled by 1/(1-p) in training") {
  Tensor x = ones({100000});
  nn::Dropout drop(0.25);
  drop.eval();
  CHECK(drop.forward(x).is_same(x));
  drop.train();
  auto y = drop.forward(x).tolist<float>();
  int64_t zeros_count = 0, wrong_scale = 0;
  for (float v : y) {
    if (v == 0) ++zeros_count;
    else if (std::abs(v - 1 / 0.75) > 1e-6) ++wrong_scale;
  }
  CHECK(wrong_scale == 0);
  CHECK(double(zeros_count) / double(y.size()) == doctest::Approx(0.25).epsilon(0.03));
  CHECK_THROWS_WITH_AS(nn::Dropout(1.5), doctest::Contains("between 0 and 1"), Error);
}

TEST_CASE("CrossEntropyLoss matches log-sum-exp by hand, with weight, ignore_index, smoothing, reductions") {
  Tensor logits = from_vector<double>({1, 2, 3, 1, 1, 1, 0, 5, 0}, {3, 3});
  Tensor target = from_vector<int64_t>({2, 0, 1}, {3});
  auto nll = [](std::vector<double> z, int t) {
    double m = *std::max_element(z.begin(), z.end()), s = 0;
    for (double v : z) s += std::exp(v - m);
    return -(z[t] - m - std::log(s));
  };
  const double l0 = nll({1, 2, 3}, 2), l1 = nll({1, 1, 1}, 0), l2 = nll({0, 5, 0}, 1);
  nn::CrossEntropyLoss mean_loss;
  CHECK(mean_loss(logits, target).item<double>() == doctest::Approx((l0 + l1 + l2) / 3));
  nn::CrossEntropyLoss sum_loss(Tensor(), Reduction::Sum);
  CHECK(sum_loss(logits, target).item<double>() == doctest::Approx(l0 + l1 + l2));
  nn::CrossEntropyLoss none_loss(Tensor(), Reduction::None);
  check_close(none_loss(logits, target).tolist<double>(), {l0, l1, l2}, 1e-12);

  Tensor w = from_vector<double>({1, 2, 3}, {3});
  nn::CrossEntropyLoss weighted(w);
  CHECK(weighted(logits, target).item<double>() == doctest::Approx((3 * l0 + 1 * l1 + 2 * l2) / 6));
  CHECK(weighted.state_dict().keys() == std::vector<std::string>{"weight"});
  CHECK(weighted.weight.storage() != w.storage());  // the loss keeps its own copy
  CHECK(mean_loss.state_dict().empty());

  nn::CrossEntropyLoss ignoring(Tensor(), Reduction::Mean, /*ignore_index=*/0);
  CHECK(ignoring(logits, target).item<double>() == doctest::Approx((l0 + l2) / 2));

  // Smoothing eps: loss = (1 - eps) * nll + eps * mean over classes of -log p.
  nn::CrossEntropyLoss smooth(Tensor(), Reduction::Mean, -100, 0.1);
  auto uniform_part = [&](std::vector<double> z) { return (nll(z, 0) + nll(z, 1) + nll(z, 2)) / 3; };
  const double want = (0.9 * (l0 + l1 + l2) + 0.1 * (uniform_part({1, 2, 3}) + uniform_part({1, 1, 1}) +
                                                     uniform_part({0, 5, 0}))) / 3;
  CHECK(smooth(logits, target).item<double>() == doctest::Approx(want));

  Tensor z = leaf({4, 5}, 12);
  Tensor t = from_vector<int64_t>({0, 4, 2, 2}, {4});
  gradcheck([&](const auto& in) { return nn::CrossEntropyLoss()(in[0], t); }, {z});
  CHECK_THROWS_WITH_AS(mean_loss.forward(logits), doctest::Contains("(input, target)"), Error);
}
