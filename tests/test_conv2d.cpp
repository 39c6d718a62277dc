// conv2d: forward against a naive loop written from the definition, gradients by finite
// differences (float64 path), the float32 oneDNN path against the float64 one in every
// memory layout, concurrent use, and the errors users see.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <omp.h>

#include "autograd/ops.h"
#include "core/memory.h"  // defines: memory_stats, reset_peak_memory_stats
#include "gradcheck.h"
#include "tensor_compare.h"  // defines: testing::relative_error

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;

namespace {

struct Config {
  const char* name;
  Shape input;   // [N, C, H, W]
  Shape weight;  // [O, C / groups, kH, kW]
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
  bool bias;
};

// Small enough for finite differences, and together they cover every parameter,
// including strides that leave a remainder (the right/bottom border is never read).
const std::vector<Config> kConfigs = {
    {"3x3 pad 1", {2, 3, 5, 6}, {4, 3, 3, 3}, {1}, {1}, {1}, 1, true},
    {"stride 2, remainder", {1, 2, 8, 7}, {3, 2, 3, 3}, {2}, {0}, {1}, 1, true},
    {"asymmetric stride/pad/kernel", {2, 2, 6, 5}, {3, 2, 3, 2}, {2, 1}, {2, 1}, {1}, 1, false},
    {"dilation 2", {1, 2, 7, 7}, {2, 2, 3, 3}, {1}, {2}, {2}, 1, true},
    {"groups 2", {2, 4, 5, 5}, {6, 2, 3, 3}, {1}, {1}, {1}, 2, true},
    {"1x1 stride 2 (downsample)", {2, 3, 6, 6}, {5, 3, 1, 1}, {2}, {0}, {1}, 1, false},
};

// out[n, o, y, x] = b[o] + sum_{c, i, j} in[n, g*C/G + c, y*s - p + i*d, x*s - p + j*d] * w[o, c, i, j]
std::vector<double> naive_conv2d(const Config& cfg, const std::vector<double>& in, const std::vector<double>& w,
                                 const std::vector<double>& b, const Shape& out_shape) {
  const int64_t N = cfg.input[0], C = cfg.input[1], H = cfg.input[2], W = cfg.input[3];
  const int64_t O = cfg.weight[0], Cg = cfg.weight[1], KH = cfg.weight[2], KW = cfg.weight[3];
  const int64_t OH = out_shape[2], OW = out_shape[3];
  auto pick = [](const std::vector<int64_t>& v, int axis) { return v.size() == 2 ? v[axis] : v[0]; };
  const int64_t sh = pick(cfg.stride, 0), sw = pick(cfg.stride, 1), ph = pick(cfg.padding, 0),
                pw = pick(cfg.padding, 1), dh = pick(cfg.dilation, 0), dw = pick(cfg.dilation, 1);
  std::vector<double> out(static_cast<size_t>(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t y = 0; y < OH; ++y)
        for (int64_t x = 0; x < OW; ++x) {
          double acc = cfg.bias ? b[o] : 0.0;
          const int64_t group = o / (O / cfg.groups);
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                const int64_t iy = y * sh - ph + i * dh, ix = x * sw - pw + j * dw;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                acc += in[((n * C + group * Cg + c) * H + iy) * W + ix] * w[((o * Cg + c) * KH + i) * KW + j];
              }
          out[((n * O + o) * OH + y) * OW + x] = acc;
        }
  return out;
}

struct Operands {
  Tensor input, weight, bias;  // float64 leaves
};

Operands make_operands(const Config& cfg, uint64_t seed) {
  return {leaf(cfg.input, seed), leaf(cfg.weight, seed + 1, 0.5), cfg.bias ? leaf({cfg.weight[0]}, seed + 2) : Tensor()};
}

Tensor run(const Config& cfg, const Tensor& input, const Tensor& weight, const Tensor& bias) {
  return conv2d(input, weight, bias, cfg.stride, cfg.padding, cfg.dilation, cfg.groups);
}

// max |a - b| / (1 + max |b|): a float32 result against a float64 one of the same sums.
double relative_error(const Tensor& a, const Tensor& b) { return loom::testing::relative_error(a, b, 1.0); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Sets LOOM_CONV2D_LAYOUT for one scope (see Note [Conv2d memory layout]).
struct LayoutGuard {
  explicit LayoutGuard(const char* layout) { setenv("LOOM_CONV2D_LAYOUT", layout, 1); }
  ~LayoutGuard() { unsetenv("LOOM_CONV2D_LAYOUT"); }
};

}  // namespace

TEST_CASE("conv2d forward matches the definition, in float64 and float32") {
  for (const Config& cfg : kConfigs) {
    const std::string config = cfg.name;
    CAPTURE(config);
    Operands ops = make_operands(cfg, 11);
    Tensor out = run(cfg, ops.input, ops.weight, ops.bias);
    std::vector<double> bias_values = cfg.bias ? ops.bias.tolist<double>() : std::vector<double>{};
    auto expected = naive_conv2d(cfg, ops.input.tolist<double>(), ops.weight.tolist<double>(), bias_values,
                                 out.shape());
    auto got = out.tolist<double>();
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));

    Tensor out32 = run(cfg, ops.input.to(kFloat32), ops.weight.to(kFloat32),
                       cfg.bias ? ops.bias.to(kFloat32) : Tensor());
    CHECK(out32.dtype() == kFloat32);
    CHECK(out32.shape() == out.shape());
    CHECK(relative_error(out32, out) < 1e-5);
  }
}

TEST_CASE("conv2d output shapes follow PyTorch's formula") {
  Tensor x = zeros({2, 3, 32, 32});
  CHECK(conv2d(x, zeros({8, 3, 3, 3}), Tensor(), {1}, {1}).shape() == Shape{2, 8, 32, 32});
  CHECK(conv2d(x, zeros({8, 3, 3, 3}), Tensor(), {2}, {1}).shape() == Shape{2, 8, 16, 16});
  CHECK(conv2d(x, zeros({8, 3, 1, 1}), Tensor(), {2}, {0}).shape() == Shape{2, 8, 16, 16});
  CHECK(conv2d(x, zeros({8, 3, 5, 3}), Tensor(), {3, 1}, {0, 2}, {2, 1}).shape() == Shape{2, 8, 8, 34});
}

TEST_CASE("conv2d gradients match finite differences (float64)") {
  for (const Config& cfg : kConfigs) {
    const std::string config = cfg.name;
    CAPTURE(config);
    Operands ops = make_operands(cfg, 21);
    std::vector<Tensor> inputs = {ops.input, ops.weight};
    if (cfg.bias) inputs.push_back(ops.bias);
    gradcheck([&](const std::vector<Tensor>& t) { return run(cfg, t[0], t[1], cfg.bias ? t[2] : Tensor()); },
              inputs);
  }
}

TEST_CASE("conv2d backward with only the input requiring grad") {
  const Config& cfg = kConfigs[0];
  Operands ops = make_operands(cfg, 31);
  Tensor frozen_weight = ops.weight.detach();
  Tensor out = run(cfg, ops.input, frozen_weight, ops.bias.detach());
  out.backward(ones_like(out));
  CHECK(ops.input.grad().defined());
  CHECK_FALSE(ops.weight.grad().defined());
  CHECK_FALSE(ops.bias.grad().defined());
}

// Forward and all three gradients of `cfg` in float32 (oneDNN) against float64 (direct
// loops) on the same values, within `tolerance` relative error.
static void check_float32_against_float64(const Config& cfg, uint64_t seed, double tolerance) {
  Operands ops = make_operands(cfg, seed);
  Tensor out64 = run(cfg, ops.input, ops.weight, ops.bias);
  Tensor grad = randn(out64.shape(), TensorOptions(kFloat64));
  out64.backward(grad);

  Tensor x = ops.input.detach().to(kFloat32).requires_grad_(true);
  Tensor w = ops.weight.detach().to(kFloat32).requires_grad_(true);
  Tensor b = cfg.bias ? ops.bias.detach().to(kFloat32).requires_grad_(true) : Tensor();
  Tensor out32 = run(cfg, x, w, b);
  out32.backward(grad.to(kFloat32));
  CHECK(relative_error(out32, out64) < tolerance);
  CHECK(relative_error(x.grad(), ops.input.grad()) < tolerance);
  CHECK(relative_error(w.grad(), ops.weight.grad()) < tolerance);
  if (cfg.bias) CHECK(relative_error(b.grad(), ops.bias.grad()) < tolerance);
}

// The float32 path (oneDNN) against the float64 path (direct loops) on the same values,
// in each memory layout a plan can use, and on a shape large enough for blocked kernels.
TEST_CASE("conv2d float32 gradients (oneDNN) match the float64 reference in every layout") {
  std::vector<Config> configs = kConfigs;
  configs.push_back({"resnet-like 16->32 stride 2", {4, 16, 10, 10}, {32, 16, 3, 3}, {2}, {1}, {1}, 1, true});
  for (const char* layout : {"blocked", "nchw", "nhwc"}) {
    LayoutGuard guard(layout);
    for (const Config& cfg : configs) {
      const std::string config = std::string(cfg.name) + " (" + layout + ")";
      CAPTURE(config);
      check_float32_against_float64(cfg, 41, 1e-5);
    }
  }
}

// Note [Conv2d algorithm]: 3x3 stride-1 convolutions run as Winograd where oneDNN has it;
// its float32 results are a little less exact than the direct algorithm's.
TEST_CASE("conv2d float32 with the Winograd and the direct algorithm, against float64") {
  const std::vector<Config> configs = {
      {"32->32 3x3 on 8x8", {4, 32, 8, 8}, {32, 32, 3, 3}, {1}, {1}, {1}, 1, false},
      {"16->48 3x3 on 6x5, bias", {3, 16, 6, 5}, {48, 16, 3, 3}, {1}, {1}, {1}, 1, true},
      {"3->16 stem", {2, 3, 8, 8}, {16, 3, 3, 3}, {1}, {1}, {1}, 1, false},
  };
  for (const char* algorithm : {"winograd", "direct"}) {
    setenv("LOOM_CONV2D_ALGO", algorithm, 1);
    for (const Config& cfg : configs) {
      const std::string config = std::string(cfg.name) + " (" + algorithm + ")";
      CAPTURE(config);
      check_float32_against_float64(cfg, 61, std::strcmp(algorithm, "winograd") == 0 ? 2e-5 : 1e-5);
    }
  }
  setenv("LOOM_CONV2D_ALGO", "fast", 1);
  CHECK_THROWS_WITH_AS(conv2d(zeros({1, 1, 3, 3}), zeros({1, 1, 3, 3}), Tensor(), {1}, {1}),
                       doctest::Contains("LOOM_CONV2D_ALGO: expected 'auto', 'winograd' or 'direct', got 'fast'"), Error);
  unsetenv("LOOM_CONV2D_ALGO");
}

// The four results of a forward and backward pass, and the most memory each pass held.
struct PassResults {
  Tensor y, gx, gw, gb;
  int64_t forward = 0, backward = 0;  // the caching allocator's peak in each, over what it held before
};

// One forward + backward under LOOM_CONV2D_MAX_WORKSPACE=bound. The scratchpads and reorders
// are the allocator's tensors (Note [oneDNN scratchpad]), so its peak shows them.
PassResults conv_pass(const char* bound, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy) {
  setenv("LOOM_CONV2D_MAX_WORKSPACE", bound, 1);
  PassResults r;
  const auto peak_of = [](auto&& pass) {
    reset_peak_memory_stats();
    const int64_t before = memory_stats(Device("cpu")).allocated_bytes;
    pass();
    return memory_stats(Device("cpu")).peak_allocated_bytes - before;
  };
  Tensor xi = x.detach().requires_grad_(true), wi = w.detach().requires_grad_(true), bi = b.detach().requires_grad_(true);
  r.forward = peak_of([&] { r.y = conv2d(xi, wi, bi, {1}, {1}); });
  r.backward = peak_of([&] { r.y.backward(gy); });
  r.gx = xi.grad(), r.gw = wi.grad(), r.gb = bi.grad();
  unsetenv("LOOM_CONV2D_MAX_WORKSPACE");
  return r;
}

// Note [Convolutions in batch slices]
TEST_CASE("a pass whose workspace passes LOOM_CONV2D_MAX_WORKSPACE runs in batch slices, with the same results") {
  Generator gen(8);
  struct Case {
    const char* name;
    int64_t n, c, o, hw;
    MemoryFormat format;
    const char* algorithm;
    const char* bound;
  };
  // airbench94's largest layer at batch 64 (oneDNN's Winograd on AVX-512 needs 63 MB of
  // scratchpad), in both layouts; and its 31x31 layer with the direct algorithm, whose
  // workspace is the NCHW activations' blocked copies (12 MiB at batch 32), on every CPU.
  // Bounds that make a few slices each (every slice size is a plan to build).
  const Case cases[] = {{"64 -> 256 at 15x15", 64, 64, 256, 15, MemoryFormat::Contiguous, "auto", "16MiB"},
                        {"64 -> 256 at 15x15, channels-last", 64, 64, 256, 15, MemoryFormat::ChannelsLast, "auto", "16MiB"},
                        {"24 -> 64 at 31x31, direct", 32, 24, 64, 31, MemoryFormat::Contiguous, "direct", "4MiB"}};
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    setenv("LOOM_CONV2D_ALGO", c.algorithm, 1);
    const Tensor x = randn({c.n, c.c, c.hw, c.hw}, {}, &gen).contiguous(c.format);
    const Tensor w = randn({c.o, c.c, 3, 3}, {}, &gen) * 0.05;
    const Tensor b = randn({c.o}, {}, &gen);
    const Tensor gy = randn({c.n, c.o, c.hw, c.hw}, {}, &gen).contiguous(c.format);
    const PassResults whole = conv_pass("none", x, w, b, gy);
    const PassResults sliced = conv_pass(c.bound, x, w, b, gy);
    unsetenv("LOOM_CONV2D_ALGO");
    // The same sums, rounded otherwise: oneDNN picks its Winograd schedule by the batch it is
    // given, and the weight and bias gradients add the slices' sums.
    CHECK(relative_error(sliced.y, whole.y) < 1e-5);
    CHECK(relative_error(sliced.gx, whole.gx) < 1e-5);
    CHECK(relative_error(sliced.gw, whole.gw) < 1e-5);
    CHECK(relative_error(sliced.gb, whole.gb) < 1e-5);
    CHECK(sliced.y.is_contiguous(c.format));
    // The slices' workspace is far smaller than one call's. Over it, the forward pass holds
    // its output; the backward pass its gradients and grad_out in the computing layout,
    // which backward-data keeps for backward-weights (the same either way).
    const int64_t y_bytes = 4 * whole.y.numel(), mib = 1 << 20;
    MESSAGE(name, ": forward workspace ", (whole.forward - y_bytes) / mib, " MiB in one call, ",
            (sliced.forward - y_bytes) / mib, " in slices; backward peak ", whole.backward / mib, " and ",
            sliced.backward / mib);
    if (whole.forward - y_bytes > 8 * mib) {  // oneDNN's passes (on AVX2, loom's Winograd takes no workspace)
      CHECK(sliced.forward - y_bytes < (whole.forward - y_bytes) / 2);
      CHECK(sliced.backward < whole.backward);
    }
    CHECK(sliced.forward <= whole.forward);
    CHECK(sliced.backward <= whole.backward);
  }
  setenv("LOOM_CONV2D_MAX_WORKSPACE", "lots", 1);
  CHECK_THROWS_WITH_AS(conv2d(randn({2, 4, 6, 6}), randn({4, 4, 3, 3}), Tensor(), {1}, {1}),
                       doctest::Contains("LOOM_CONV2D_MAX_WORKSPACE: expected a positive memory size such as 64MiB, "
                                         "or 'none', got 'lots'"),
                       Error);
  unsetenv("LOOM_CONV2D_MAX_WORKSPACE");
}

TEST_CASE("conv2d takes non-contiguous inputs") {
  Generator gen(5);
  Tensor base = randn({2, 6, 6, 3}, TensorOptions(kFloat64), &gen);
  Tensor x = base.permute({0, 3, 1, 2});  // NHWC storage seen as NCHW
  REQUIRE_FALSE(x.is_contiguous());
  Tensor w = randn({4, 3, 3, 3}, TensorOptions(kFloat64), &gen);
  CHECK(relative_error(conv2d(x, w, Tensor(), {1}, {1}), conv2d(x.contiguous(), w, Tensor(), {1}, {1})) == 0.0);
}

TEST_CASE("one conv2d plan serves several threads at once") {
  Generator gen(6);
  Tensor x = randn({8, 16, 12, 12}, {}, &gen);
  Tensor w = randn({16, 16, 3, 3}, {}, &gen);
  Tensor expected = conv2d(x, w, Tensor(), {1}, {1});
  std::vector<Tensor> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] { results[t] = conv2d(x, w, Tensor(), {1}, {1}); });
  for (auto& thread : threads) thread.join();
  for (const Tensor& r : results) CHECK(relative_error(r, expected) == 0.0);
}

TEST_CASE("conv2d errors name what was expected and what came") {
  Tensor x = zeros({1, 3, 8, 8});
  std::string message = error_of([&] { conv2d(zeros({3, 8, 8}), zeros({4, 3, 3, 3})); });
  CHECK(message.find("4-D input") != std::string::npos);
  CHECK(message.find("[3, 8, 8]") != std::string::npos);
  CHECK(message.find("unsqueeze(0)") != std::string::npos);

  message = error_of([&] { conv2d(x, zeros({4, 3, 3})); });
  CHECK(message.find("[4, 3, 3]") != std::string::npos);

  message = error_of([&] { conv2d(x, zeros({4, 2, 3, 3})); });
  CHECK(message.find("[1, 3, 8, 8]") != std::string::npos);
  CHECK(message.find("[4, 2, 3, 3]") != std::string::npos);

  message = error_of([&] { conv2d(zeros({1, 4, 8, 8}), zeros({3, 2, 3, 3}), Tensor(), {1}, {0}, {1}, 2); });
  CHECK(message.find("divisible by groups") != std::string::npos);

  message = error_of([&] { conv2d(x, zeros({4, 3, 3, 3}), zeros({5})); });
  CHECK(message.find("[4]") != std::string::npos);
  CHECK(message.find("[5]") != std::string::npos);

  message = error_of([&] { conv2d(zeros({1, 3, 2, 2}), zeros({4, 3, 3, 3})); });
  CHECK(message.find("smaller than the kernel") != std::string::npos);

  message = error_of([&] { conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {0}); });
  CHECK(message.find("stride") != std::string::npos);
  CHECK(error_of([&] { conv2d(x, zeros({4, 3, 3, 3}), Tensor(), {1, 1, 1}); }).find("1 or 2 values") !=
        std::string::npos);

  CHECK_THROWS_AS(conv2d(x, zeros({4, 3, 3, 3}, kFloat64)), Error);
}

TEST_CASE("conv2d: a weight with no output channels or an empty kernel is named, not passed to oneDNN") {
  Tensor x = randn({1, 3, 5, 5});
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({4, 3, 0, 0})), doctest::Contains("has no output channels or an empty kernel"),
                       Error);
  CHECK_THROWS_WITH_AS(conv2d(x, zeros({0, 3, 3, 3})), doctest::Contains("has no output channels or an empty kernel"),
                       Error);
}
// Note [oneDNN's strided 1x1 weight gradient in nhwc]: with 2 threads, oneDNN's own kernel
// got this weight gradient wrong in about one call in five; loom must get it right every time.
TEST_CASE("a strided 1x1 convolution's weight gradient in nhwc, with 2 threads, every time") {
  LayoutGuard guard("nhwc");
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(2);
  for (int repeat = 0; repeat < 10; ++repeat)
    for (int64_t channels : {3, 4, 7, 12}) {
      const Config cfg{"1x1 stride 2", {8, channels, 16, 16}, {2 * channels, channels, 1, 1}, {2}, {0}, {1}, 1, false};
      CAPTURE(channels);
      CAPTURE(repeat);
      check_float32_against_float64(cfg, 43 + static_cast<uint64_t>(repeat), 1e-5);
    }
  omp_set_num_threads(threads_before);
}
