// Channels-last tensors (Note [Channels-last activations], core/memory_format.h): the
// strides and predicates, the ops that keep the format, and every CPU kernel a ResNet
// runs on them -- conv2d, batch norm (plain and fused), the elementwise ops -- giving the
// values and gradients that NCHW input gives. float64 goes through the finite-difference
// check; a tiny ResNet trained three SGD steps from channels-last images ends where NCHW
// images take it.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "core/factory.h"
#include "device_compare.h"  // defines: rel_error
#include "gradcheck.h"       // defines: gradcheck
#include "nn/nn.h"

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::rel_error;

namespace {

constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

Tensor rnd(const Shape& shape, uint64_t seed, DType dtype = kFloat32) {
  Generator gen(seed);
  return randn(shape, TensorOptions(kFloat32), &gen).to(dtype);
}

Tensor leaf(const Tensor& t) { return t.detach().requires_grad_(true); }

bool is_channels_last(const Tensor& t) { return t.suggest_memory_format() == kCL; }

}  // namespace

TEST_CASE("channels-last strides, predicates and the ambiguous shapes") {
  CHECK(strides_for({2, 3, 4, 5}, kCL) == Shape{60, 1, 15, 3});
  CHECK(strides_for({2, 3, 4, 5}, MemoryFormat::Contiguous) == Shape{60, 20, 5, 1});
  Tensor x = empty({2, 3, 4, 5}, {}, kCL);
  CHECK(x.is_contiguous(kCL));
  CHECK_FALSE(x.is_contiguous());
  CHECK(x.suggest_memory_format() == kCL);
  // [N, C, 1, 1] and C == 1 are dense both ways: they count as contiguous.
  Tensor pooled = empty({2, 8, 1, 1}, {}, kCL);
  CHECK(pooled.is_contiguous());
  CHECK(pooled.is_contiguous(kCL));
  CHECK(pooled.suggest_memory_format() == MemoryFormat::Contiguous);
  // A transpose is neither.
  Tensor t = rnd({2, 3, 4, 5}, 1).transpose(2, 3);
  CHECK_FALSE(t.is_contiguous(kCL));
  CHECK(t.suggest_memory_format() == MemoryFormat::Contiguous);
  // Errors say what channels_last needs.
  try {
    (void)empty({3, 4, 5}, {}, kCL);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("expected a 4-D tensor [N, C, H, W], got shape [3, 4, 5]") != std::string::npos);
  }
  CHECK_THROWS_WITH_AS((void)rnd({3, 4}, 2).contiguous(kCL), doctest::Contains("4-D"), Error);
}

TEST_CASE("contiguous(format) converts both ways, keeps values, copies only when needed, and is differentiable") {
  Tensor x = leaf(rnd({2, 3, 4, 5}, 3));
  Tensor y = x.contiguous(kCL);
  CHECK(is_channels_last(y));
  CHECK(y.tolist<float>() == x.tolist<float>());  // same logical values
  CHECK(y.contiguous(kCL).is_same(y));
  Tensor back = y.contiguous();
  CHECK(back.is_contiguous());
  CHECK(back.tolist<float>() == x.tolist<float>());
  sum(y * y).backward();
  CHECK(rel_error(x.grad(), x.detach() * 2.0) == 0.0);
}

TEST_CASE("empty_like, clone, zeros_like, to(dtype) and the elementwise ops keep the channels-last format") {
  Tensor x = rnd({2, 4, 3, 3}, 4).contiguous(kCL);
  CHECK(is_channels_last(empty_like(x)));
  CHECK_FALSE(is_channels_last(empty_like(x, MemoryFormat::Contiguous)));
  CHECK(is_channels_last(clone(x)));
  CHECK(is_channels_last(zeros_like(x)));
  CHECK(is_channels_last(x.to(kBFloat16)));
  CHECK(is_channels_last(x.to(kFloat64)));
  Tensor plain = x.contiguous();
  Tensor bias = rnd({4, 1, 1}, 5);
  for (const auto& entry : std::initializer_list<std::pair<const char*, Tensor (*)(const Tensor&, const Tensor&)>>{
           {"x + y", [](const Tensor& a, const Tensor& b) { return a + b; }},
           {"x * y", [](const Tensor& a, const Tensor& b) { return a * b; }},
           {"relu(x) - y", [](const Tensor& a, const Tensor& b) { return relu(a) - b; }}}) {
    const char* name = entry.first;  // Note [doctest messages name no structured binding]
    const auto op = entry.second;
    CAPTURE(name);
    Tensor cl = op(x, x);
    CHECK(is_channels_last(cl));
    CHECK(cl.tolist<float>() == op(plain, plain).tolist<float>());
    // One NCHW and one channels-last operand, and a broadcast one: the values still agree.
    CHECK(op(x, plain).tolist<float>() == op(plain, plain).tolist<float>());
    CHECK(op(plain, x).tolist<float>() == op(plain, plain).tolist<float>());
    Tensor b = op(x, bias);
    CHECK(is_channels_last(b));
    CHECK(b.tolist<float>() == op(plain, bias).tolist<float>());
  }
}

TEST_CASE("conv2d on channels-last input: channels-last output and input gradient, values as NCHW") {
  struct Case {
    DType dtype;
    // float32 computes in the same blocked layout both ways on AVX-512, and on AVX2
    // (LOOM_CPU_ISA=avx2) in loom's Winograd, whose NCHW and NHWC passes sum in other
    // orders (Note [Winograd in channels-last]; 1.8e-6 apart measured); bfloat16 in nhwc
    // vs blocked.
    double tol;
  };
  for (const Case& c : {Case{kFloat32, 4e-6}, Case{kBFloat16, 1e-2}, Case{kFloat64, 1e-12}}) {
    CAPTURE(c.dtype);
    for (int64_t stride : {1, 2}) {
      CAPTURE(stride);
      Tensor x_plain = leaf(rnd({2, 16, 8, 8}, 6, c.dtype));
      Tensor x_cl = leaf(x_plain.detach().contiguous(kCL));
      Tensor w1 = leaf(rnd({32, 16, 3, 3}, 7, c.dtype)), w2 = leaf(w1.detach().clone());
      Tensor b1 = leaf(rnd({32}, 8, c.dtype)), b2 = leaf(b1.detach().clone());
      Tensor y_plain = conv2d(x_plain, w1, b1, {stride}, {1});
      Tensor y_cl = conv2d(x_cl, w2, b2, {stride}, {1});
      CHECK(is_channels_last(y_cl));
      CHECK(rel_error(y_cl, y_plain) <= c.tol);
      Tensor g = rnd(y_plain.shape(), 9, c.dtype);
      y_plain.backward(g);
      y_cl.backward(g);  // an NCHW gradient for a channels-last output: converted, not misread
      CHECK(is_channels_last(x_cl.grad()));
      CHECK(rel_error(x_cl.grad(), x_plain.grad()) <= c.tol);
      CHECK(rel_error(w2.grad(), w1.grad()) <= c.tol);
      CHECK(rel_error(b2.grad(), b1.grad()) <= c.tol);
    }
  }
}

TEST_CASE("float64 gradcheck: conv2d and batch norm on channels-last input") {
  Tensor x = leaf(rnd({2, 3, 5, 5}, 10, kFloat64));
  Tensor w = leaf(rnd({4, 3, 3, 3}, 11, kFloat64));
  Tensor b = leaf(rnd({4}, 12, kFloat64));
  gradcheck([](const auto& in) { return conv2d(in[0].contiguous(kCL), in[1], in[2], {1}, {1}); }, {x, w, b});
  Tensor bw = leaf(rnd({3}, 13, kFloat64)), bb = leaf(rnd({3}, 14, kFloat64));
  Tensor r = leaf(rnd({2, 3, 5, 5}, 15, kFloat64));
  gradcheck([](const auto& in) { return batch_norm(in[0].contiguous(kCL), Tensor(), Tensor(), in[1], in[2], true); },
            {x, bw, bb});
  gradcheck(
      [](const auto& in) {
        return batch_norm_relu(in[0].contiguous(kCL), Tensor(), Tensor(), in[1], in[2], true, 0.1, 1e-5,
                               in[3].contiguous(kCL));
      },
      {x, bw, bb, r});
}

TEST_CASE("batch norm on channels-last input: values, running statistics and every gradient as NCHW") {
  struct Case {
    DType dtype;
    double tol;
  };
  // 600 pixels per channel: more than one group of rows (kGroupRows), with a short last one.
  for (const Case& c : {Case{kFloat32, 2e-5}, Case{kBFloat16, 2e-2}}) {
    for (bool relu : {false, true}) {
      for (bool training : {true, false}) {
        CAPTURE(c.dtype);
        CAPTURE(relu);
        CAPTURE(training);
        Tensor x_plain = leaf(rnd({6, 24, 10, 10}, 16, c.dtype) * 3.0 + 1.0);
        Tensor x_cl = leaf(x_plain.detach().contiguous(kCL));
        Tensor r_plain = leaf(rnd({6, 24, 10, 10}, 17, c.dtype));
        Tensor r_cl = leaf(r_plain.detach().contiguous(kCL));
        Tensor w1 = leaf(rnd({24}, 18)), w2 = leaf(w1.detach().clone());  // float32 parameters, as autocast keeps
        Tensor b1 = leaf(rnd({24}, 19)), b2 = leaf(b1.detach().clone());
        Tensor rm1 = rnd({24}, 20), rm2 = rm1.clone();
        Tensor rv1 = rnd({24}, 21).abs() + 0.5, rv2 = rv1.clone();
        auto run = [&](const Tensor& x, const Tensor& r, const Tensor& w, const Tensor& b, Tensor& rm, Tensor& rv) {
          return relu ? batch_norm_relu(x, rm, rv, w, b, training, 0.1, 1e-5, r)
                      : batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
        };
        Tensor y_plain = run(x_plain, r_plain, w1, b1, rm1, rv1);
        Tensor y_cl = run(x_cl, r_cl, w2, b2, rm2, rv2);
        CHECK(is_channels_last(y_cl));
        CHECK(rel_error(y_cl, y_plain) <= c.tol);
        CHECK(rel_error(rm2, rm1) <= 1e-6);
        CHECK(rel_error(rv2, rv1) <= 1e-6);
        Tensor g = rnd(y_plain.shape(), 22, c.dtype).contiguous(kCL);
        y_plain.backward(g);
        y_cl.backward(g);
        CHECK(is_channels_last(x_cl.grad()));
        CHECK(rel_error(x_cl.grad(), x_plain.grad()) <= c.tol);
        CHECK(rel_error(w2.grad(), w1.grad()) <= c.tol);
        CHECK(rel_error(b2.grad(), b1.grad()) <= c.tol);
        if (relu) CHECK(rel_error(r_cl.grad(), r_plain.grad()) <= c.tol);
      }
    }
  }
}

// Three SGD steps of a tiny ResNet from `images` (NCHW or channels-last), in float32 or
// under bfloat16 autocast; returns the trained parameters.
OrderedDict<Tensor> train_tiny(const Tensor& images, bool bf16) {
  manual_seed(0);
  auto model = nn::resnet_tiny(10);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
  Generator gen(24);
  Tensor labels = randint(0, 10, {images.size(0)}, TensorOptions(kInt64), &gen);
  nn::CrossEntropyLoss criterion;
  for (int step = 0; step < 3; ++step) {
    Tensor loss;
    {
      auto guard = bf16 ? std::make_unique<autocast::Guard>(DeviceType::CPU, kBFloat16) : nullptr;
      loss = criterion((*model)(images), labels);
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return model->named_parameters();
}

// max over parameters of rel_error(a[name], b[name])
double max_rel_error(OrderedDict<Tensor>& a, OrderedDict<Tensor>& b) {
  double worst = 0;
  for (const auto& [name, value] : b) worst = std::max(worst, rel_error(a[name], value));
  return worst;
}

TEST_CASE("a tiny ResNet trained from channels-last images ends where NCHW images take it") {
  Tensor images = rnd({8, 3, 16, 16}, 23);
  auto f32 = train_tiny(images, false);
  auto f32_cl = train_tiny(images.contiguous(kCL), false);
  // float32: the convolutions compute in one blocked layout either way, the batch norms
  // group their sums differently (rows vs planes): float rounding apart.
  CHECK(max_rel_error(f32_cl, f32) <= 1e-4);
  // bfloat16: channels-last convolutions run other oneDNN kernels (nhwc, not blocked), so
  // the two bf16 runs differ by bf16 rounding; channels-last must be no further from the
  // float32 run than NCHW is.
  auto bf16 = train_tiny(images, true);
  auto bf16_cl = train_tiny(images.contiguous(kCL), true);
  const double err_nchw = max_rel_error(bf16, f32), err_cl = max_rel_error(bf16_cl, f32);
  MESSAGE("bf16 vs float32 after 3 steps: NCHW ", err_nchw, ", channels-last ", err_cl);
  CHECK(err_cl <= 1.5 * err_nchw);
}
