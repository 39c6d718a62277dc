// Pooling: max_pool2d, avg_pool2d and adaptive_avg_pool2d against naive loops written
// here from PyTorch's definitions, output sizes PyTorch gives, gradients by finite
// differences, and the errors users see.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "autograd/ops.h"
#include "gradcheck.h"
#include "tensor_compare.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

namespace {

struct Window {
  int64_t k, s, p, d;
};

// Reference max pooling of one [H, W] plane, visiting every window position and
// skipping those in the padding: (values, flat argmax indices).
std::pair<std::vector<double>, std::vector<int64_t>> naive_max_plane(const double* x, int64_t H, int64_t W, Window wh,
                                                                     Window ww, int64_t OH, int64_t OW) {
  std::vector<double> values;
  std::vector<int64_t> indices;
  for (int64_t oh = 0; oh < OH; ++oh) {
    for (int64_t ow = 0; ow < OW; ++ow) {
      double best = -std::numeric_limits<double>::infinity();
      int64_t at = -1;
      for (int64_t i = 0; i < wh.k; ++i) {
        for (int64_t j = 0; j < ww.k; ++j) {
          int64_t h = oh * wh.s - wh.p + i * wh.d, w = ow * ww.s - ww.p + j * ww.d;
          if (h < 0 || h >= H || w < 0 || w >= W) continue;
          if (at < 0 || x[h * W + w] > best) {
            best = x[h * W + w];
            at = h * W + w;
          }
        }
      }
      values.push_back(best);
      indices.push_back(at);
    }
  }
  return {values, indices};
}

// Reference average pooling of one plane (no dilation, as avg_pool2d).
std::vector<double> naive_avg_plane(const double* x, int64_t H, int64_t W, Window wh, Window ww, int64_t OH,
                                    int64_t OW, bool count_include_pad) {
  std::vector<double> out;
  for (int64_t oh = 0; oh < OH; ++oh) {
    for (int64_t ow = 0; ow < OW; ++ow) {
      double sum = 0;
      int64_t inside = 0, padded = 0;
      for (int64_t i = 0; i < wh.k; ++i) {
        for (int64_t j = 0; j < ww.k; ++j) {
          int64_t h = oh * wh.s - wh.p + i, w = ow * ww.s - ww.p + j;
          // A window position counts towards the padded divisor when it is inside
          // the padded image [-p, size + p).
          if (h < H + wh.p && w < W + ww.p) ++padded;
          if (h < 0 || h >= H || w < 0 || w >= W) continue;
          sum += x[h * W + w];
          ++inside;
        }
      }
      out.push_back(sum / static_cast<double>(count_include_pad ? padded : inside));
    }
  }
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& expected, double tol = 1e-12) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(tol));
}

}  // namespace

TEST_CASE("pooling output sizes follow PyTorch, including ceil_mode's last-window rule") {
  Tensor x5 = zeros({1, 1, 5, 5});
  CHECK(max_pool2d(x5, {2}).shape() == Shape{1, 1, 2, 2});
  CHECK(max_pool2d(x5, {2}, {}, {0}, {1}, /*ceil_mode=*/true).shape() == Shape{1, 1, 3, 3});
  // ceil would give 3, but the third window would start in the right padding: 2.
  CHECK(max_pool2d(x5, {3}, {3}, {1}, {1}, true).shape() == Shape{1, 1, 2, 2});
  CHECK(avg_pool2d(x5, {3}, {3}, {1}, true).shape() == Shape{1, 1, 2, 2});
  CHECK(max_pool2d(zeros({2, 3, 112, 112}), {3}, {2}, {1}).shape() == Shape{2, 3, 56, 56});
  CHECK(max_pool2d(zeros({1, 7, 9}), {2, 3}, {1, 2}, {1, 1}, {2, 1}).shape() == Shape{1, 7, 5});
  CHECK(adaptive_avg_pool2d(zeros({2, 4, 7, 5}), {3, 2}).shape() == Shape{2, 4, 3, 2});
  CHECK(adaptive_avg_pool2d(zeros({4, 7, 5}), {1}).shape() == Shape{4, 1, 1});
}

TEST_CASE("max_pool2d values and argmax indices match a naive loop") {
  struct Case {
    Window h, w;
    bool ceil;
  };
  const Case cases[] = {
      {{2, 2, 0, 1}, {2, 2, 0, 1}, false}, {{3, 2, 1, 1}, {3, 2, 1, 1}, true}, {{3, 1, 1, 2}, {2, 3, 1, 1}, false},
      {{3, 3, 1, 1}, {2, 2, 1, 1}, true},  {{4, 2, 2, 1}, {3, 1, 0, 2}, true},
  };
  Tensor x = leaf({2, 3, 9, 8}, 3);
  auto values = x.detach().tolist<double>();
  for (const Case& c : cases) {
    CAPTURE(c.h.k);
    CAPTURE(c.w.k);
    x.set_grad(Tensor());
    Tensor out = max_pool2d(x, {c.h.k, c.w.k}, {c.h.s, c.w.s}, {c.h.p, c.w.p}, {c.h.d, c.w.d}, c.ceil);
    // The gradient of sum(out) counts how often each element was its window's argmax,
    // which checks the saved indices exactly.
    out.sum().backward();
    const int64_t OH = out.size(2), OW = out.size(3);
    auto got = out.detach().tolist<double>();
    auto wins = x.grad().tolist<double>();
    for (int64_t plane = 0; plane < 6; ++plane) {
      auto [ref, ref_index] = naive_max_plane(values.data() + plane * 72, 9, 8, c.h, c.w, OH, OW);
      std::vector<double> got_plane(got.begin() + plane * OH * OW, got.begin() + (plane + 1) * OH * OW);
      CHECK(got_plane == ref);
      std::vector<double> ref_wins(72, 0.0);
      for (int64_t at : ref_index) ref_wins[static_cast<size_t>(at)] += 1;
      CHECK(std::vector<double>(wins.begin() + plane * 72, wins.begin() + (plane + 1) * 72) == ref_wins);
    }
  }
}

TEST_CASE("max_pool2d propagates NaN and its backward accumulates over overlapping windows") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = from_vector<double>({1, nan, 3, 4}, {1, 1, 2, 2});
  CHECK(std::isnan(max_pool2d(x, {2}).item<double>()));

  // 3x3 windows at stride 1 over a 4x4 plane whose maximum is at (1, 1): it wins 4 windows.
  std::vector<double> v(16, 0.0);
  v[5] = 10;
  Tensor y = from_vector<double>(v, {1, 1, 4, 4}).requires_grad_(true);
  max_pool2d(y, {3}, {1}).sum().backward();
  auto g = y.grad().tolist<double>();
  CHECK(g[5] == 4.0);
  CHECK(y.grad().sum().item<double>() == 4.0);
}

TEST_CASE("avg_pool2d matches a naive loop with and without count_include_pad") {
  Tensor x = leaf({2, 2, 7, 6}, 4).detach();
  auto values = x.tolist<double>();
  const Window cases[][2] = {{{2, 2, 0, 1}, {2, 2, 0, 1}}, {{3, 2, 1, 1}, {3, 2, 1, 1}}, {{3, 1, 1, 1}, {2, 3, 1, 1}}};
  for (const auto& c : cases) {
    for (bool ceil : {false, true}) {
      for (bool include_pad : {false, true}) {
        Tensor out = avg_pool2d(x, {c[0].k, c[1].k}, {c[0].s, c[1].s}, {c[0].p, c[1].p}, ceil, include_pad);
        const int64_t OH = out.size(2), OW = out.size(3);
        auto got = out.tolist<double>();
        for (int64_t plane = 0; plane < 4; ++plane) {
          auto ref = naive_avg_plane(values.data() + plane * 42, 7, 6, c[0], c[1], OH, OW, include_pad);
          check_close(std::vector<double>(got.begin() + plane * OH * OW, got.begin() + (plane + 1) * OH * OW), ref);
        }
      }
    }
  }
  // Hand-computed: a corner window of a 2x2 pool with padding 1 sees one real element.
  Tensor ones4 = ones({1, 1, 2, 2}, kFloat64);
  CHECK(avg_pool2d(ones4, {2}, {2}, {1}, false, true).tolist<double>() == std::vector<double>{0.25, 0.25, 0.25, 0.25});
  CHECK(avg_pool2d(ones4, {2}, {2}, {1}, false, false).tolist<double>() == std::vector<double>{1, 1, 1, 1});
}

TEST_CASE("adaptive_avg_pool2d uses PyTorch's floor/ceil windows and a fast 1x1 path") {
  Tensor x = leaf({2, 3, 7, 5}, 5).detach();
  auto values = x.tolist<double>();
  for (auto [OH, OW] : {std::pair<int64_t, int64_t>{3, 2}, {7, 5}, {4, 4}, {1, 1}, {2, 3}}) {
    auto got = adaptive_avg_pool2d(x, {OH, OW}).tolist<double>();
    std::vector<double> ref;
    for (int64_t plane = 0; plane < 6; ++plane) {
      for (int64_t i = 0; i < OH; ++i) {
        for (int64_t j = 0; j < OW; ++j) {
          auto h0 = static_cast<int64_t>(std::floor(double(i * 7) / double(OH)));
          auto h1 = static_cast<int64_t>(std::ceil(double((i + 1) * 7) / double(OH)));
          auto w0 = static_cast<int64_t>(std::floor(double(j * 5) / double(OW)));
          auto w1 = static_cast<int64_t>(std::ceil(double((j + 1) * 5) / double(OW)));
          double sum = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) sum += values[static_cast<size_t>(plane * 35 + h * 5 + w)];
          ref.push_back(sum / double((h1 - h0) * (w1 - w0)));
        }
      }
    }
    check_close(got, ref);
  }
}

TEST_CASE("float32 pooling on many planes (the threaded path) agrees with float64") {
  Tensor x64 = leaf({16, 32, 16, 16}, 6).detach();
  Tensor x32 = x64.to(kFloat32);
  auto compare = [](const Tensor& a32, const Tensor& a64) {
    auto got = a32.tolist<float>();
    auto ref = a64.tolist<double>();
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == doctest::Approx(ref[i]).epsilon(1e-5));
  };
  compare(max_pool2d(x32, {3}, {2}, {1}, {1}, true), max_pool2d(x64, {3}, {2}, {1}, {1}, true));
  compare(avg_pool2d(x32, {3}, {2}, {1}, true, false), avg_pool2d(x64, {3}, {2}, {1}, true, false));
  compare(adaptive_avg_pool2d(x32, {1}), adaptive_avg_pool2d(x64, {1}));
  compare(adaptive_avg_pool2d(x32, {5, 3}), adaptive_avg_pool2d(x64, {5, 3}));
}

TEST_CASE("strided (non-contiguous) inputs pool like their contiguous copies") {
  Tensor x = leaf({2, 3, 6, 7}, 12).detach().transpose(2, 3);  // [2, 3, 7, 6], strided
  Tensor dense = x.contiguous();
  CHECK(max_pool2d(x, {3}, {2}, {1}).tolist<double>() == max_pool2d(dense, {3}, {2}, {1}).tolist<double>());
  CHECK(avg_pool2d(x, {2}, {1}, {1}, true, false).tolist<double>() ==
        avg_pool2d(dense, {2}, {1}, {1}, true, false).tolist<double>());
  CHECK(adaptive_avg_pool2d(x, {3, 2}).tolist<double>() == adaptive_avg_pool2d(dense, {3, 2}).tolist<double>());
}

TEST_CASE("max_pool2d gradients (padding, stride, dilation, ceil_mode)") {
  Tensor x = leaf({2, 2, 7, 6}, 8);
  gradcheck([](const auto& in) { return max_pool2d(in[0], {2}); }, {x});
  gradcheck([](const auto& in) { return max_pool2d(in[0], {3}, {2}, {1}, {1}, true); }, {x});
  gradcheck([](const auto& in) { return max_pool2d(in[0], {3}, {1}, {1}); }, {x});  // overlapping windows
  gradcheck([](const auto& in) { return max_pool2d(in[0], {2, 3}, {2, 1}, {1, 1}, {2, 1}, true); }, {x});
  Tensor x3 = leaf({2, 5, 5}, 9);
  gradcheck([](const auto& in) { return max_pool2d(in[0], {2}, {2}, {0}, {1}, true); }, {x3});
}

TEST_CASE("avg_pool2d gradients (padding, stride, ceil_mode, count_include_pad)") {
  Tensor x = leaf({2, 2, 7, 6}, 10);
  for (bool ceil : {false, true}) {
    for (bool include_pad : {false, true}) {
      gradcheck([=](const auto& in) { return avg_pool2d(in[0], {3}, {2}, {1}, ceil, include_pad); }, {x});
      gradcheck([=](const auto& in) { return avg_pool2d(in[0], {2, 3}, {1, 2}, {1, 0}, ceil, include_pad); }, {x});
    }
  }
  gradcheck([](const auto& in) { return avg_pool2d(in[0], {2}); }, {x});
}

TEST_CASE("adaptive_avg_pool2d gradients, including overlapping windows and 1x1") {
  Tensor x = leaf({2, 3, 7, 5}, 11);
  gradcheck([](const auto& in) { return adaptive_avg_pool2d(in[0], {1, 1}); }, {x});
  gradcheck([](const auto& in) { return adaptive_avg_pool2d(in[0], {3, 2}); }, {x});
  gradcheck([](const auto& in) { return adaptive_avg_pool2d(in[0], {4, 4}); }, {x});
}

TEST_CASE("pooling errors say what was expected and what came") {
  Tensor x = zeros({1, 2, 4, 4});
  CHECK_THROWS_WITH_AS(max_pool2d(zeros({4, 4}), {2}), doctest::Contains("expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got 2-D input of shape [4, 4]"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(zeros({1, 1, 1, 2, 2}), {2}), doctest::Contains("got 5-D input"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {5}), doctest::Contains("larger than the padded input (4 x 4"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {3}, {1}, {1}, {3}), doctest::Contains("larger than the padded input (6 x 6"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {2}, {2}, {2}), doctest::Contains("padding must be between 0 and half the kernel size, got padding (2, 2) for kernel_size (2, 2)"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {0}), doctest::Contains("kernel_size must be positive, got (0, 0)"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(x, {2}, {0, 1}), doctest::Contains("stride must be positive, got (0, 1)"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(x, {2, 2, 2}), doctest::Contains("kernel_size to be a single int or a pair (H, W), got 3 values"), Error);
  CHECK_THROWS_WITH_AS(adaptive_avg_pool2d(x, {0, 2}), doctest::Contains("expected a positive output_size, got (0, 2)"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(zeros({1, 2, 4, 4}, kInt64), {2}), doctest::Contains("expected a floating-point tensor"), Error);
  CHECK_THROWS_WITH_AS(adaptive_avg_pool2d(zeros({1, 0, 4, 4}), {1}), doctest::Contains("non-empty"), Error);
}

TEST_CASE("pooling sizes are computed without overflow: a huge window is an error, not an output") {
  Tensor x = randn({1, 1, 4, 4});
  CHECK_THROWS_WITH_AS(max_pool2d(x, {int64_t(1) << 62}), doctest::Contains("is larger than the padded input"), Error);
  // dilation 2^62 times (kernel - 1) = 4 wrapped to 0 in 64 bits: a 4 x 4 "output".
  CHECK_THROWS_WITH_AS(max_pool2d(x, {5}, {1}, {0}, {int64_t(1) << 62}),
                       doctest::Contains("is larger than the padded input"), Error);
}

TEST_CASE("max_pool2d without padding (the fast loops) picks the first maximum, as the general rule, on ties and NaN") {
  // Small integers make ties common; a few NaN windows take the chain's rule (the last NaN wins).
  for (int64_t k : {2, 3}) {
    CAPTURE(k);
    Generator gen(static_cast<uint64_t>(k));
    Tensor x = randint(0, 3, {2, 3, 2 * k + 1, 3 * k + 2}, TensorOptions(kInt64), &gen).to(kFloat32);
    std::vector<float> v = x.tolist<float>();
    v[5] = std::numeric_limits<float>::quiet_NaN();
    v[40] = std::numeric_limits<float>::quiet_NaN();
    v[41] = std::numeric_limits<float>::quiet_NaN();
    x = from_vector(v, x.shape());
    Tensor xg = x.detach().requires_grad_(true);
    Tensor y = max_pool2d(xg, {k, k});
    const int64_t h = x.size(2), w = x.size(3), oh = h / k, ow = w / k;
    const auto got = y.tolist<float>();
    // The gradient of sum(y) marks each window's chosen element: the argmax.
    sum(y).backward();
    const auto marks = xg.grad().tolist<float>();
    for (int64_t plane = 0; plane < 6; ++plane)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          float best = -std::numeric_limits<float>::infinity();
          int64_t at = (i * k) * w + j * k;
          for (int64_t a = i * k; a < i * k + k; ++a)
            for (int64_t b = j * k; b < j * k + k; ++b) {
              const float e = v[static_cast<size_t>(plane * h * w + a * w + b)];
              if (e > best || std::isnan(e)) best = e, at = a * w + b;
            }
          const float out = got[static_cast<size_t>(plane * oh * ow + i * ow + j)];
          CHECK(((std::isnan(best) && std::isnan(out)) || out == best));
          CHECK(marks[static_cast<size_t>(plane * h * w + at)] >= 1.0f);
        }
  }
}

TEST_CASE("max_pool2d keeps a channels-last input channels-last, with NCHW's values, indices and gradient") {
  for (int64_t k : {2, 3}) {
    CAPTURE(k);
    Generator gen(static_cast<uint64_t>(10 + k));
    Tensor x = randint(0, 4, {3, 5, 2 * k + 1, 3 * k}, TensorOptions(kInt64), &gen).to(kFloat32);
    std::vector<float> v = x.tolist<float>();
    v[7] = std::numeric_limits<float>::quiet_NaN();
    x = from_vector(v, x.shape());
    Tensor a = x.detach().requires_grad_(true);
    Tensor b = x.contiguous(MemoryFormat::ChannelsLast).detach().requires_grad_(true);
    Tensor ya = max_pool2d(a, {k, k}), yb = max_pool2d(b, {k, k});
    CHECK(yb.is_contiguous(MemoryFormat::ChannelsLast));
    const auto va = ya.tolist<float>(), vb = yb.tolist<float>();
    for (size_t i = 0; i < va.size(); ++i) CHECK(((std::isnan(va[i]) && std::isnan(vb[i])) || va[i] == vb[i]));
    Tensor w = randn(ya.shape(), {}, &gen);
    sum(ya * w).backward();
    sum(yb * w).backward();
    CHECK(b.grad().is_contiguous(MemoryFormat::ChannelsLast));
    CHECK(testing::max_abs_diff(a.grad(), b.grad()) == 0.0);
  }
  Tensor d = randn({2, 3, 6, 7}, TensorOptions(kFloat64)).requires_grad_(true);
  testing::gradcheck(
      [](const std::vector<Tensor>& in) { return max_pool2d(in[0].contiguous(MemoryFormat::ChannelsLast), {2, 2}); },
      {d});
}
