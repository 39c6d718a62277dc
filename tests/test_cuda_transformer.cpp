// The CUDA backend's transformer kernels (cuda/transformer.cu: layer_norm, gelu;
// cuda/attention.cu: the fused scaled_dot_product_attention; cuda/adamw.cu: the AdamW
// update) against the CPU's on the same inputs, through the autograd ops; softmax over a
// middle dim and Embedding, which run on kernels of tests/test_cuda_nn.cpp; and a small
// Vision Transformer's training step on the GPU against the same step on the CPU.
//
// Every case but the first needs a GPU and is *skipped* without one (doctest counts it as
// skipped); the first checks, in any CUDA build, that each transformer kernel has both a
// CPU and a CUDA implementation.
//
// Tolerances, float32 (float64 is held to 1e-10 relative):
// - 1e-5 relative (plus a small absolute floor for values that are differences of larger
//   ones): layer_norm, gelu (CUDA's erfc/exp/tanh are not glibc's), softmax, attention
//   (sums in another order, exp of another library);
// - 1e-6: AdamW's update (both compilers fuse multiply-adds, in their own places);
// - the ViT step: 1e-4 relative for the logits and loss, 1e-3 in norm for the gradients
//   (cuDNN's patch convolution, TF32 off, and a dozen layers of reordered float sums),
//   1e-5 in norm for the parameters AdamW updates from the same gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: layer_norm, gelu, softmax, scaled_dot_product_attention, cross_entropy
#include "core/factory.h"
#include "core/kernels.h"        // declares: the transformer kernels, adamw_update_kernel
#include "cuda/backends.h"       // defines: set_cudnn_allow_tf32
#include "cuda/device.h"         // defines: is_available, is_compiled
#include "device_compare.h"      // defines: kCuda0, to_device, host_values, random_cpu, check_close(_norm)
#include "nn/embedding.h"        // defines: Embedding
#include "nn/optim/adamw.h"      // defines: AdamW
#include "nn/vision_transformer.h"

using namespace loom;
using namespace loom::testing;

namespace {

const bool kGpu = cuda::is_available();
Tensor gpu(const Tensor& t) { return to_device(t, kCuda0); }

// float32 with `f32` relative tolerance, float64 with 1e-10.
double tol_for(DType dtype, double f32) { return dtype == kFloat64 ? 1e-10 : f32; }

void check_close(const std::string& what, const Tensor& got, const Tensor& expected, double rtol, double atol = 0.0) {
  INFO(what);
  REQUIRE(got.defined() == expected.defined());
  if (got.defined()) testing::check_close(got, expected, rtol, atol);
}

// `f(inputs)` on CPU copies and on CUDA copies of `inputs`, those flagged in `grads`
// requiring grad, backpropagated with one random output gradient: the output and the
// gradient of every flagged input compared.
void check_op_and_grads(const std::string& what, const std::vector<Tensor>& inputs, const std::vector<bool>& grads,
                        const std::function<Tensor(const std::vector<Tensor>&)>& f, double rtol, double atol) {
  REQUIRE(inputs.size() == grads.size());
  std::vector<Tensor> cpu_in, gpu_in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor c = inputs[i].defined() ? inputs[i].detach().clone() : Tensor(), g = gpu(inputs[i]);
    if (grads[i]) {
      c.requires_grad_(true);
      g.requires_grad_(true);
    }
    cpu_in.push_back(c);
    gpu_in.push_back(g);
  }
  Tensor cpu_out = f(cpu_in), gpu_out = f(gpu_in);
  REQUIRE(gpu_out.device() == kCuda0);
  check_close(what + ": output", gpu_out, cpu_out, rtol, atol);
  Tensor grad = random_cpu(cpu_out.shape(), cpu_out.dtype(), -1, 1, 99);
  cpu_out.backward(grad);
  gpu_out.backward(gpu(grad));
  for (size_t i = 0; i < inputs.size(); ++i)
    if (grads[i])
      check_close(what + ": gradient of input " + std::to_string(i), gpu_in[i].grad(), cpu_in[i].grad(), rtol, atol);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("cuda_transformer") {

TEST_CASE("every transformer kernel has a CPU and a CUDA implementation" * doctest::skip(!cuda::is_compiled())) {
  auto both = [](const auto& stub) { return stub.has(DeviceType::CPU) && stub.has(DeviceType::CUDA); };
  CHECK(both(layer_norm_forward_kernel));
  CHECK(both(layer_norm_backward_kernel));
  CHECK(both(gelu_forward_kernel));
  CHECK(both(gelu_backward_kernel));
  CHECK(both(flash_attention_forward_kernel));
  CHECK(both(flash_attention_backward_kernel));
  CHECK(both(adamw_update_kernel));
  CHECK(both(log_softmax_forward_kernel));  // softmax = exp(log_softmax)
  CHECK(both(index_select_kernel));         // Embedding's forward ...
  CHECK(both(index_add_kernel));            // ... and backward
}

TEST_CASE("layer_norm forward and backward match the CPU: affine or not, one or two normalized dims" *
          doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO(dtype);
    const double rtol = tol_for(dtype, 1e-5), atol = tol_for(dtype, 1e-6);
    const Tensor x = random_cpu({4, 7, 33}, dtype, -3, 5, 1);  // 33 columns: more than a warp, not a multiple
    const Tensor w = random_cpu({33}, dtype, 0.5, 1.5, 2), b = random_cpu({33}, dtype, -1, 1, 3);
    check_op_and_grads("affine", {x, w, b}, {true, true, true},
                       [](const std::vector<Tensor>& in) { return layer_norm(in[0], {33}, in[1], in[2], 1e-5); },
                       rtol, atol);
    check_op_and_grads("no affine", {x}, {true},
                       [](const std::vector<Tensor>& in) { return layer_norm(in[0], {33}, Tensor(), Tensor(), 1e-6); },
                       rtol, atol);
    const Tensor x2 = random_cpu({3, 5, 12}, dtype, -2, 2, 4);
    const Tensor w2 = random_cpu({5, 12}, dtype, 0.5, 1.5, 5), b2 = random_cpu({5, 12}, dtype, -1, 1, 6);
    check_op_and_grads("two normalized dims", {x2, w2, b2}, {true, true, true},
                       [](const std::vector<Tensor>& in) { return layer_norm(in[0], {5, 12}, in[1], in[2], 1e-5); },
                       rtol, atol);
    // ViT-tiny's rows (192 wide), many of them: every block and the column blocks busy.
    const Tensor x3 = random_cpu({300, 192}, dtype, -1, 1, 7);
    const Tensor w3 = random_cpu({192}, dtype, 0.5, 1.5, 8), b3 = random_cpu({192}, dtype, -1, 1, 9);
    check_op_and_grads("300 rows of 192", {x3, w3, b3}, {true, true, true},
                       [](const std::vector<Tensor>& in) { return layer_norm(in[0], {192}, in[1], in[2], 1e-6); },
                       rtol, dtype == kFloat64 ? 1e-10 : 1e-5);
    // A transposed (non-contiguous) input.
    const Tensor xt = random_cpu({33, 6}, dtype, -1, 1, 10);
    check_op_and_grads("strided input", {xt, w, b}, {true, true, true},
                       [](const std::vector<Tensor>& in) {
                         return layer_norm(in[0].transpose(0, 1), {33}, in[1], in[2], 1e-5);
                       },
                       rtol, atol);
  }
}

TEST_CASE("gelu, exact and tanh, forward and backward match the CPU" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const char* approximate : {"none", "tanh"}) {
      INFO(dtype, ", approximate=", approximate);
      const Tensor x = random_cpu({1000}, dtype, -8, 8, 11);  // both tails and the middle
      const std::string form = approximate;
      check_op_and_grads(std::string("gelu ") + approximate, {x}, {true},
                         [form](const std::vector<Tensor>& in) { return gelu(in[0], form); }, tol_for(dtype, 1e-5),
                         tol_for(dtype, 1e-6));
      const Tensor xs = random_cpu({8, 6}, dtype, -3, 3, 12);
      check_op_and_grads(std::string("gelu on a transposed view ") + approximate, {xs}, {true},
                         [form](const std::vector<Tensor>& in) { return gelu(in[0].transpose(0, 1), form); },
                         tol_for(dtype, 1e-5), tol_for(dtype, 1e-6));
    }
  }
}

TEST_CASE("softmax over a middle dim matches the CPU, forward and backward" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO(dtype);
    const Tensor x = random_cpu({3, 7, 5}, dtype, -4, 4, 13);
    check_op_and_grads("softmax(dim=1)", {x}, {true},
                       [](const std::vector<Tensor>& in) { return softmax(in[0], 1); }, tol_for(dtype, 1e-5),
                       tol_for(dtype, 1e-7));
  }
}

TEST_CASE("scaled_dot_product_attention's fused kernel matches the CPU: no mask, causal, bool, additive, "
          "a fully masked row" * doctest::skip(!kGpu)) {
  // Sizes that fill no tile exactly (16 queries, 32 keys per tile on the GPU).
  const int64_t B = 2, H = 3, L = 37, S = 45, E = 16, Ev = 24;
  for (DType dtype : {kFloat32, kFloat64}) {
    INFO(dtype);
    const double rtol = tol_for(dtype, 1e-5), atol = tol_for(dtype, 1e-6);
    const Tensor q = random_cpu({B, H, L, E}, dtype, -1, 1, 20);
    const Tensor k = random_cpu({B, H, S, E}, dtype, -1, 1, 21);
    const Tensor v = random_cpu({B, H, S, Ev}, dtype, -1, 1, 22);
    const std::vector<bool> qkv_grads = {true, true, true};
    check_op_and_grads("no mask", {q, k, v}, qkv_grads,
                       [](const std::vector<Tensor>& in) {
                         return scaled_dot_product_attention(in[0], in[1], in[2]);
                       },
                       rtol, atol);
    check_op_and_grads("is_causal, L < S", {q, k, v}, qkv_grads,
                       [](const std::vector<Tensor>& in) {
                         return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, /*is_causal=*/true);
                       },
                       rtol, atol);
    const Tensor kl = random_cpu({B, H, L, E}, dtype, -1, 1, 23), vl = random_cpu({B, H, L, Ev}, dtype, -1, 1, 24);
    check_op_and_grads("is_causal, L == S, scale 0.3", {q, kl, vl}, qkv_grads,
                       [](const std::vector<Tensor>& in) {
                         return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), 0.0, true, 0.3);
                       },
                       rtol, atol);
    // A bool mask [L, S] broadcast over batch and heads (true = attend), about half true.
    const Tensor u = random_cpu({L, S}, kFloat32, 0, 1, 25);
    const Tensor keep = gt(u, wrap_scalar(0.5, u));
    check_op_and_grads("bool mask [L, S]", {q, k, v, keep}, {true, true, true, false},
                       [](const std::vector<Tensor>& in) {
                         return scaled_dot_product_attention(in[0], in[1], in[2], in[3]);
                       },
                       rtol, atol);
    // An additive mask [B, 1, L, S] broadcast over heads.
    const Tensor additive = random_cpu({B, 1, L, S}, dtype, -3, 1, 26);
    check_op_and_grads("additive mask [B, 1, L, S]", {q, k, v, additive}, {true, true, true, false},
                       [](const std::vector<Tensor>& in) {
                         return scaled_dot_product_attention(in[0], in[1], in[2], in[3]);
                       },
                       rtol, atol);
    // Row 5 sees no key: its output is NaN on both devices and it sends no gradient.
    Tensor blind = ones({L, S}, TensorOptions(kBool));
    blind.select(0, 5).fill_(0.0);
    blind.select(0, 30).narrow(0, 0, 40).fill_(0.0);  // and row 30 sees only the last 5 keys (a later tile)
    check_op_and_grads("a fully masked row", {q, k, v, blind}, {true, true, true, false},
                       [](const std::vector<Tensor>& in) {
                         return scaled_dot_product_attention(in[0], in[1], in[2], in[3]);
                       },
                       rtol, atol);
  }
}

TEST_CASE("the fused attention kernels write the CPU's output and log-sum-exp, large head dims too" *
          doctest::skip(!kGpu)) {
  // E = Ev = 128 in float32 and 64 in float64 need more than 48 KiB of shared memory per
  // block: the opt-in path of Note [Flash attention on the GPU].
  // Named copies, not a structured binding: clang 16 cannot capture one in INFO's lambda
  // under OpenMP (the sanitizer builds).
  for (const auto& shape : {std::pair{kFloat32, int64_t{128}}, std::pair{kFloat64, int64_t{64}},
                            std::pair{kFloat32, int64_t{8}}}) {
    const DType dtype = shape.first;
    const int64_t dim = shape.second;
    INFO(dtype, ", head dim ", dim);
    const int64_t N = 3, L = 50, S = 33;
    const Tensor q = random_cpu({N, L, dim}, dtype, -1, 1, 30), k = random_cpu({N, S, dim}, dtype, -1, 1, 31);
    const Tensor v = random_cpu({N, S, dim}, dtype, -1, 1, 32), dout = random_cpu({N, L, dim}, dtype, -1, 1, 33);
    for (bool causal : {false, true}) {
      INFO("is_causal ", causal);
      const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
      Tensor out = empty({N, L, dim}, TensorOptions(dtype)), lse = empty({N, L}, TensorOptions(dtype));
      flash_attention_forward_kernel(kCpu)(q, k, v, Tensor(), causal, scale, out, lse);
      Tensor gout = gpu_empty({N, L, dim}, dtype), glse = gpu_empty({N, L}, dtype);
      flash_attention_forward_kernel(kCuda0)(gpu(q), gpu(k), gpu(v), Tensor(), causal, scale, gout, glse);
      check_close("out", gout, out, tol_for(dtype, 1e-5), tol_for(dtype, 1e-6));
      check_close("lse", glse, lse, tol_for(dtype, 1e-5), tol_for(dtype, 1e-6));
      Tensor gq = empty({N, L, dim}, TensorOptions(dtype)), gk = empty({N, S, dim}, TensorOptions(dtype));
      Tensor gv = empty({N, S, dim}, TensorOptions(dtype));
      flash_attention_backward_kernel(kCpu)(dout, q, k, v, Tensor(), causal, scale, out, lse, gq, gk, gv);
      Tensor dq = gpu_empty({N, L, dim}, dtype), dk = gpu_empty({N, S, dim}, dtype), dv = gpu_empty({N, S, dim}, dtype);
      flash_attention_backward_kernel(kCuda0)(gpu(dout), gpu(q), gpu(k), gpu(v), Tensor(), causal, scale, gout, glse,
                                              dq, dk, dv);
      check_close("grad_q", dq, gq, tol_for(dtype, 1e-5), tol_for(dtype, 1e-6));
      check_close("grad_k", dk, gk, tol_for(dtype, 1e-5), tol_for(dtype, 1e-6));
      check_close("grad_v", dv, gv, tol_for(dtype, 1e-5), tol_for(dtype, 1e-6));
    }
  }
}

TEST_CASE("the transformer ops refuse operands on two devices, naming both" * doctest::skip(!kGpu)) {
  const Tensor x = gpu(random_cpu({2, 8}, kFloat32, -1, 1, 40));
  const Tensor w_cpu = random_cpu({8}, kFloat32, 0, 1, 41);
  try {
    layer_norm(x, {8}, w_cpu, Tensor(), 1e-5);
    FAIL("layer_norm accepted a weight on another device");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "same device"));
    CHECK(contains(e.what(), "cuda:0"));
  }
  const Tensor q = gpu(random_cpu({1, 4, 8}, kFloat32, -1, 1, 42)), k_cpu = random_cpu({1, 4, 8}, kFloat32, -1, 1, 43);
  try {
    scaled_dot_product_attention(q, k_cpu, q);
    FAIL("scaled_dot_product_attention accepted a key on another device");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "same device"));
  }
  const Tensor mask_cpu = ones({4, 4}, TensorOptions(kBool));
  try {
    scaled_dot_product_attention(q, q, q, mask_cpu);
    FAIL("scaled_dot_product_attention accepted a mask on another device");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "attn_mask"));
  }
}

TEST_CASE("Embedding's lookup and its gradient match the CPU" * doctest::skip(!kGpu)) {
  manual_seed(50);
  auto cpu_embed = std::make_shared<nn::Embedding>(20, 12);
  auto gpu_module = cpu_embed->clone(kCuda0);
  auto& gpu_embed = dynamic_cast<nn::Embedding&>(*gpu_module);
  const Tensor ids = random_cpu({4, 9}, kInt64, 0, 20, 51);  // repeated rows: the gradient sums them
  Tensor cpu_out = (*cpu_embed)(ids), gpu_out = gpu_embed(gpu(ids));
  check_close("lookup", gpu_out, cpu_out, 0.0);  // a gather: exact
  const Tensor grad = random_cpu(cpu_out.shape(), kFloat32, -1, 1, 52);
  cpu_out.backward(grad);
  gpu_out.backward(gpu(grad));
  check_close("weight gradient", gpu_embed.weight.grad(), cpu_embed->weight.grad(), 1e-6, 1e-7);  // atomics
  try {  // an index out of range is the CPU's error
    gpu_embed(gpu(from_vector<int64_t>({0, 20}, {2})));
    FAIL("Embedding accepted index 20 of 20");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "index out of range"));
  }
}

TEST_CASE("the fused AdamW update matches the CPU over several steps: weight decay, amsgrad, maximize" *
          doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (bool amsgrad : {false, true}) {
      for (bool maximize : {false, true}) {
        INFO(dtype, ", amsgrad ", amsgrad, ", maximize ", maximize);
        const optim::AdamWOptions options{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = amsgrad, .maximize = maximize};
        Tensor cpu_p = random_cpu({1000}, dtype, -1, 1, 60).requires_grad_(true);
        Tensor gpu_p = gpu(cpu_p.detach()).requires_grad_(true);
        optim::AdamW cpu_opt({cpu_p}, options), gpu_opt({gpu_p}, options);
        for (int step = 0; step < 4; ++step) {
          INFO("step ", step);
          const Tensor g = random_cpu({1000}, dtype, -2, 2, 61 + static_cast<uint64_t>(step));
          cpu_p.set_grad(g.clone());
          gpu_p.set_grad(gpu(g));
          cpu_opt.step();
          gpu_opt.step();
          check_close("parameter", gpu_p.detach(), cpu_p.detach(), tol_for(dtype, 1e-6), tol_for(dtype, 1e-7));
        }
        const OrderedDict<Tensor> cpu_state = cpu_opt.state_dict(), gpu_state = gpu_opt.state_dict();
        for (const auto& [name, t] : cpu_state) {
          const Tensor* other = gpu_state.find(name);
          REQUIRE(other);
          check_close("state " + name, *other, t, tol_for(dtype, 1e-6), tol_for(dtype, 1e-9));
        }
      }
    }
  }
}

TEST_CASE("a small Vision Transformer's training step on the GPU matches the same step on the CPU" *
          doctest::skip(!kGpu)) {
  cuda::set_cudnn_allow_tf32(false);  // the patch convolution in full float32, as the CPU
  manual_seed(70);
  nn::VisionTransformerOptions o;
  o.image_size = 8;
  o.patch_size = 4;
  o.num_layers = 2;
  o.num_heads = 2;
  o.hidden_dim = 32;
  o.mlp_dim = 64;
  o.num_classes = 5;
  auto cpu_model = std::make_shared<nn::VisionTransformer>(o);
  auto gpu_model = cpu_model->clone(kCuda0);
  const Tensor images = random_cpu({6, 3, 8, 8}, kFloat32, -2, 2, 71);
  const Tensor labels = random_cpu({6}, kInt64, 0, 5, 72);
  const optim::AdamWOptions options{.lr = 1e-3, .weight_decay = 0.05};
  optim::AdamW cpu_opt(cpu_model->parameters(), options), gpu_opt(gpu_model->parameters(), options);
  for (int step = 0; step < 2; ++step) {  // the second step reads the moments
    INFO("step ", step);
    Tensor cpu_logits = (*cpu_model)(images), gpu_logits = (*gpu_model)(gpu(images));
    check_close("logits", gpu_logits, cpu_logits, 1e-4, 1e-5);
    Tensor cpu_loss = cross_entropy(cpu_logits, labels), gpu_loss = cross_entropy(gpu_logits, gpu(labels));
    check_close("loss", gpu_loss, cpu_loss, 1e-4);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    cpu_loss.backward();
    gpu_loss.backward();
    auto cpu_params = cpu_model->named_parameters(), gpu_params = gpu_model->named_parameters();
    for (auto& [name, p] : cpu_params) {
      check_close_norm("grad of " + name, gpu_params[name].grad(), p.grad(), 1e-3);
      // Adam divides each gradient element by its own magnitude: an element that is zero up
      // to float noise may have either sign on the two devices and move its parameter by
      // +-lr. So both optimizers step from the CPU's gradients (AdamW alone is checked above).
      gpu_params[name].set_grad(gpu(p.grad()));
    }
    cpu_opt.step();
    gpu_opt.step();
    for (auto& [name, p] : cpu_params) check_close_norm("updated " + name, gpu_params[name].detach(), p.detach(), 1e-5);
  }
  cuda::set_cudnn_allow_tf32(true);
}

}  // TEST_SUITE
