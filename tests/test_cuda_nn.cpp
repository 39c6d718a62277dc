// The CUDA backend's neural-network kernels (cuda/index.cu, pooling.cu, batch_norm.cu,
// softmax_loss.cu, dropout.cu, sgd.cu) against the CPU backend on random inputs, their
// autograd gradients on CUDA, the allocator over a training loop, and a ResNet18 step on
// the GPU against the same step on the CPU.
//
// Every case here needs a GPU and is *skipped* without one (doctest counts it as
// skipped). The CPU-only checks of the backend (kernel registration coverage, cuBLAS not
// mapped at load) are in tests/test_cuda.cpp.
//
// Tolerances, float32 (float64 is held to 1e-12 where the math is the same):
// - exact (0): gathers, copies, max pooling, dropout, the SGD update -- the GPU does the
//   same rounded operations in the same order as the CPU;
// - 1e-6 relative: sums in a different order (avg pooling, atomics in index_add, batch
//   norm's double accumulation vs the CPU's per-plane float partials);
// - 1e-5: exp/log in log_softmax (CUDA's and glibc's differ by an ulp or two);
// - ResNet18: relative to each tensor's largest element, 1e-4 (loss, outputs) and 2e-3
//   (gradients, updated parameters): cuDNN picks other convolution algorithms than
//   oneDNN (TF32 turned off here), and 20 layers of reordered float sums compound.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"
#include "device_compare.h"  // defines: kCuda0, to_device, host_values, random_cpu, check_close, check_close_norm
#include "core/allocator.h"  // defines: memory_stats
#include "core/copy.h"
#include "core/factory.h"
#include "core/kernels.h"
#include "cuda/backends.h"  // defines: set_cudnn_allow_tf32
#include "cuda/device.h"    // defines: is_available, synchronize
#include "nn/loss.h"        // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"   // defines: SGD, sgd_update_kernel
#include "nn/resnet.h"      // defines: resnet18, resnet_tiny

using namespace loom;

using namespace loom::testing;

namespace {

const bool kGpu = cuda::is_available();
Tensor gpu(const Tensor& t) { return to_device(t, kCuda0); }
Tensor empty_on(const Shape& shape, DType dtype, Device device) { return empty(shape, TensorOptions(dtype).device(device)); }

// check_close (tests/device_compare.h) under a label; undefined matches undefined.
void check_close(const std::string& what, const Tensor& got, const Tensor& expected, double rtol, double atol = 0.0) {
  INFO(what);
  REQUIRE(got.defined() == expected.defined());
  if (got.defined()) testing::check_close(got, expected, rtol, atol);
}

// As check_close with the tolerance relative to the largest |expected| element: for
// tensors whose small elements are differences of large ones (gradients of a deep net).
void check_close_scaled(const std::string& what, const Tensor& got, const Tensor& expected, double tol) {
  double scale = 0;
  for (double v : host_values(expected)) scale = std::max(scale, std::abs(v));
  check_close(what, got, expected, 0.0, tol * std::max(scale, 1e-30));
}

// float32 with `f32` relative tolerance, float64 with 1e-12.
double tol_for(DType dtype, double f32) { return dtype == kFloat64 ? 1e-12 : f32; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// `f(inputs)` on CPU copies and CUDA copies of `inputs` (floating ones requiring grad),
// backpropagated with the same random output gradient: output and every input gradient
// compared.
template <typename F>
void check_op_and_grads(const std::string& what, const std::vector<Tensor>& inputs, F f, double rtol, double atol = 0) {
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : inputs) {
    Tensor c = t.detach().clone(), g = gpu(t);
    if (is_floating(t.dtype())) {
      c.requires_grad_(true);
      g.requires_grad_(true);
    }
    cpu_in.push_back(c);
    gpu_in.push_back(g);
  }
  Tensor cpu_out = f(cpu_in), gpu_out = f(gpu_in);
  check_close(what + ": output", gpu_out, cpu_out, rtol, atol);
  Tensor grad = random_cpu(cpu_out.shape(), cpu_out.dtype(), -1, 1, 99);
  cpu_out.backward(grad);
  gpu_out.backward(gpu(grad));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) continue;
    check_close(what + ": gradient of input " + std::to_string(i), gpu_in[i].grad(), cpu_in[i].grad(), rtol, atol);
  }
}

bool library_mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_SUITE("cuda nn (needs a GPU)") {

TEST_CASE("index_select and gather match the CPU exactly, every dtype and a strided input" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    const Tensor in = random_cpu({5, 7, 3}, dtype, -50, 50, 1);
    const Tensor index = random_cpu({4}, kInt64, 0, 7, 2);  // repeats are likely
    for (const Tensor& source : {in, in.transpose(0, 2)}) {  // contiguous, then strided
      const int64_t dim = 1;
      Shape out_shape = source.shape();
      out_shape[dim] = 4;
      Tensor expected = empty_on(out_shape, dtype, kCpu), got = empty_on(out_shape, dtype, kCuda0);
      index_select_kernel(kCpu)(source, dim, index, expected);
      index_select_kernel(kCuda0)(gpu(source), dim, gpu(index), got);
      check_close(detail::str("index_select ", dtype), got, expected, 0.0);

      const Tensor gather_index = random_cpu(out_shape, kInt64, 0, source.size(dim), 3);
      gather_kernel(kCpu)(source, dim, gather_index, expected);
      gather_kernel(kCuda0)(gpu(source), dim, gpu(gather_index), got);
      check_close(detail::str("gather ", dtype), got, expected, 0.0);
    }
  }
}

TEST_CASE("index_add and scatter_add match the CPU (atomics: exact for int64, 1e-6 for floats)" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64, kInt64}) {
    const double tol = dtype == kInt64 ? 0.0 : tol_for(dtype, 1e-6);
    const Tensor base = random_cpu({6, 5, 4}, dtype, -20, 20, 4);
    const Tensor src = random_cpu({6, 9, 4}, dtype, -20, 20, 5);
    const Tensor index = random_cpu({9}, kInt64, 0, 5, 6);  // 9 slices into 5: repeats
    Tensor expected = base.clone(), got = gpu(base);
    index_add_kernel(kCpu)(expected, 1, index, src);
    index_add_kernel(kCuda0)(got, 1, gpu(index), gpu(src));
    check_close(detail::str("index_add ", dtype), got, expected, tol, tol);

    const Tensor scatter_index = random_cpu({6, 9, 4}, kInt64, 0, 5, 7);
    expected = base.clone();
    got = gpu(base);
    scatter_add_kernel(kCpu)(expected, 1, scatter_index, src);
    scatter_add_kernel(kCuda0)(got, 1, gpu(scatter_index), gpu(src));
    check_close(detail::str("scatter_add ", dtype), got, expected, tol, tol);
  }
}

TEST_CASE("an out-of-range index or target on the GPU is the CPU's loom::Error, not a crash" * doctest::skip(!kGpu)) {
  auto message_of = [](auto&& call) {
    try {
      call();
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const Tensor in = gpu(random_cpu({3, 7}, kFloat32, 0, 1, 8));
  Tensor out = empty_on({3, 2}, kFloat32, kCuda0);
  const Tensor bad = gpu(full({3, 2}, 9, TensorOptions(kInt64)));
  std::string m = message_of([&] { gather_kernel(kCuda0)(in, 1, bad, out); });
  INFO(m);
  CHECK(contains(m, "gather: index 9 is out of bounds for dimension 1 with size 7"));

  Tensor log_probs = gpu(random_cpu({4, 3}, kFloat32, -3, 0, 9));
  Tensor target = gpu(randint(0, 3, {4}, kInt64));
  Tensor loss = empty_on({}, kFloat32, kCuda0), total = empty_on({}, kFloat32, kCuda0);
  Tensor target_bad = to_device(target, kCpu);
  target_bad.data_ptr<int64_t>()[2] = 5;
  m = message_of([&] {
    nll_loss_forward_kernel(kCuda0)(log_probs, gpu(target_bad), Tensor(), Reduction::Mean, -100, loss, total);
  });
  INFO(m);
  CHECK(contains(m, "nll_loss: target 5 at position 2 is out of bounds"));
  // The device is still usable afterwards.
  nll_loss_forward_kernel(kCuda0)(log_probs, target, Tensor(), Reduction::Mean, -100, loss, total);
  CHECK(std::isfinite(host_values(loss)[0]));
}

TEST_CASE("pooling forward and backward match the CPU for every window option" * doctest::skip(!kGpu)) {
  struct Case {
    std::vector<int64_t> kernel, stride, padding, dilation;
    bool ceil_mode, count_include_pad;
  };
  const std::vector<Case> cases = {
      {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, true},  // ResNet-style, no overlap
      {{3, 3}, {2, 2}, {1, 1}, {1, 1}, false, true},  // overlapping windows, padding
      {{3, 2}, {1, 2}, {1, 0}, {2, 1}, true, false},  // dilation, ceil_mode, no pad count
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    const Tensor x = random_cpu({2, 3, 9, 8}, dtype, -2, 2, 10);
    for (const Case& c : cases) {
      const std::string where = detail::str(dtype, " kernel ", c.kernel[0], "x", c.kernel[1], " stride ", c.stride[0],
                                            " pad ", c.padding[0], " dilation ", c.dilation[0]);
      // Max pooling picks, and routes gradients to, the same elements: exact except
      // where overlapping windows add through atomics.
      check_op_and_grads("max_pool2d " + where, {x}, [&](const std::vector<Tensor>& in) {
        return max_pool2d(in[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
      }, tol_for(dtype, 1e-6), tol_for(dtype, 1e-6));
      check_op_and_grads("avg_pool2d " + where, {x}, [&](const std::vector<Tensor>& in) {
        return avg_pool2d(in[0], c.kernel, c.stride, c.padding, c.ceil_mode, c.count_include_pad);
      }, tol_for(dtype, 1e-6), tol_for(dtype, 1e-6));
    }
    for (std::vector<int64_t> size : {std::vector<int64_t>{1, 1}, {4, 3}, {5, 7}}) {
      check_op_and_grads(detail::str("adaptive_avg_pool2d ", dtype, " to ", size[0], "x", size[1]), {x},
                         [&](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], size); },
                         tol_for(dtype, 1e-6), tol_for(dtype, 1e-6));
    }
  }
  // The argmax indices themselves, for a window with ties (all zeros): the first wins.
  Tensor zeros_in = zeros({1, 1, 4, 4});
  Tensor out = empty_on({1, 1, 2, 2}, kFloat32, kCuda0), idx = empty_on({1, 1, 2, 2}, kInt64, kCuda0);
  Tensor out_cpu = empty({1, 1, 2, 2}), idx_cpu = empty({1, 1, 2, 2}, kInt64);
  Pool2dParams p;
  p.kernel[0] = p.kernel[1] = p.stride[0] = p.stride[1] = 2;
  max_pool2d_forward_kernel(kCpu)(zeros_in, p, out_cpu, idx_cpu);
  max_pool2d_forward_kernel(kCuda0)(gpu(zeros_in), p, out, idx);
  check_close("max_pool2d tie indices", idx, idx_cpu, 0.0);
}

TEST_CASE("batch_norm forward and backward match the CPU: training, eval, residual, relu, affine" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const double tol = tol_for(dtype, 1e-5);
    const Tensor x = random_cpu({4, 3, 5, 6}, dtype, -1, 3, 20);  // mean far from 0: cancellation would show
    const Tensor residual_values = random_cpu({4, 3, 5, 6}, dtype, -1, 1, 21);
    const Tensor w = random_cpu({3}, dtype, 0.5, 1.5, 22), b = random_cpu({3}, dtype, -0.5, 0.5, 23);
    const Tensor rm0 = random_cpu({3}, dtype, -0.1, 0.1, 24), rv0 = random_cpu({3}, dtype, 0.5, 1.5, 25);
    const Tensor dy = random_cpu({4, 3, 5, 6}, dtype, -1, 1, 26);
    for (bool training : {true, false}) {
      for (bool with_residual : {false, true}) {
        for (bool relu : {false, true}) {
          for (bool affine : {true, false}) {
            const std::string where = detail::str(dtype, training ? " training" : " eval",
                                                  with_residual ? " +residual" : "", relu ? " +relu" : "",
                                                  affine ? "" : " no affine");
            INFO(where);
            const Tensor weight = affine ? w : Tensor(), bias = affine ? b : Tensor();
            const Tensor residual = with_residual ? residual_values : Tensor();
            Tensor rm_c = rm0.clone(), rv_c = rv0.clone(), rm_g = gpu(rm0), rv_g = gpu(rv0);
            Tensor out_c = empty_on(x.shape(), dtype, kCpu), out_g = empty_on(x.shape(), dtype, kCuda0);
            Tensor mean_c = empty_on({3}, dtype, kCpu), mean_g = empty_on({3}, dtype, kCuda0);
            Tensor inv_c = empty_on({3}, dtype, kCpu), inv_g = empty_on({3}, dtype, kCuda0);
            batch_norm_forward_kernel(kCpu)(x, weight, bias, rm_c, rv_c, training, 0.1, 1e-5, residual, relu, out_c,
                                            mean_c, inv_c);
            batch_norm_forward_kernel(kCuda0)(gpu(x), gpu(weight), gpu(bias), rm_g, rv_g, training, 0.1, 1e-5,
                                              gpu(residual), relu, out_g, mean_g, inv_g);
            check_close(where + " out", out_g, out_c, tol, tol);
            check_close(where + " save_mean", mean_g, mean_c, tol, tol);
            check_close(where + " save_invstd", inv_g, inv_c, tol);
            check_close(where + " running_mean", rm_g, rm_c, tol, tol);
            check_close(where + " running_var (unbiased)", rv_g, rv_c, tol);

            // Both backwards see the CPU's output as the ReLU mask: an output within
            // rounding of 0 must not flip the mask between devices.
            const Tensor relu_out_c = relu ? out_c : Tensor(), relu_out_g = relu ? gpu(out_c) : Tensor();
            Tensor gx_c = empty_on(x.shape(), dtype, kCpu), gx_g = empty_on(x.shape(), dtype, kCuda0);
            Tensor gw_c = affine ? empty_on({3}, dtype, kCpu) : Tensor(), gw_g = affine ? empty_on({3}, dtype, kCuda0) : Tensor();
            Tensor gb_c = affine ? empty_on({3}, dtype, kCpu) : Tensor(), gb_g = affine ? empty_on({3}, dtype, kCuda0) : Tensor();
            Tensor gr_c = with_residual ? empty_on(x.shape(), dtype, kCpu) : Tensor();
            Tensor gr_g = with_residual ? empty_on(x.shape(), dtype, kCuda0) : Tensor();
            batch_norm_backward_kernel(kCpu)(dy, x, weight, mean_c, inv_c, training, relu_out_c, gx_c, gw_c, gb_c, gr_c);
            batch_norm_backward_kernel(kCuda0)(gpu(dy), gpu(x), gpu(weight), mean_g, inv_g, training, relu_out_g, gx_g,
                                               gw_g, gb_g, gr_g);
            check_close(where + " grad_input", gx_g, gx_c, tol, tol);
            check_close(where + " grad_weight", gw_g, gw_c, tol, tol);
            check_close(where + " grad_bias", gb_g, gb_c, tol, tol);
            check_close(where + " grad_residual", gr_g, gr_c, 0.0);  // the masked dy itself
          }
        }
      }
    }
  }
}

TEST_CASE("batch_norm_relu's autograd gradients on CUDA match the CPU's" * doctest::skip(!kGpu)) {
  const Tensor x = random_cpu({8, 4, 3, 3}, kFloat64, -1, 2, 30), r = random_cpu({8, 4, 3, 3}, kFloat64, -1, 1, 31);
  const Tensor w = random_cpu({4}, kFloat64, 0.5, 1.5, 32), b = random_cpu({4}, kFloat64, -0.5, 0.5, 33);
  check_op_and_grads("batch_norm_relu", {x, w, b, r}, [](const std::vector<Tensor>& in) {
    return batch_norm_relu(in[0], Tensor(), Tensor(), in[1], in[2], /*training=*/true, 0.1, 1e-5, in[3]);
  }, 1e-12, 1e-12);
}

TEST_CASE("log_softmax, nll_loss and cross_entropy match the CPU: weights, ignore_index, reductions, smoothing" *
          doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const double tol = tol_for(dtype, 1e-5);
    const Tensor logits = random_cpu({37, 10}, dtype, -6, 6, 40);
    Tensor target = random_cpu({37}, kInt64, 0, 10, 41);
    target.data_ptr<int64_t>()[3] = -100;  // ignored
    target.data_ptr<int64_t>()[11] = -100;
    const Tensor weight = random_cpu({10}, dtype, 0.2, 2, 42);
    check_op_and_grads(detail::str("log_softmax ", dtype), {logits},
                       [](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, tol, tol);
    // A wide row (more classes than a warp has threads).
    check_op_and_grads(detail::str("log_softmax wide ", dtype), {random_cpu({3, 1000}, dtype, -6, 6, 43)},
                       [](const std::vector<Tensor>& in) { return log_softmax(in[0], 1); }, tol, tol);
    for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
      for (bool weighted : {false, true}) {
        for (double smoothing : {0.0, 0.1}) {
          const std::string where = detail::str("cross_entropy ", dtype, " reduction ", static_cast<int>(reduction),
                                                weighted ? " weighted" : "", " smoothing ", smoothing);
          check_op_and_grads(where, {logits, target}, [&](const std::vector<Tensor>& in) {
            const Tensor wt = weighted ? to_device(weight, in[0].device()) : Tensor();
            return cross_entropy(in[0], in[1], wt, reduction, -100, smoothing);
          }, tol, tol);
        }
      }
    }
  }
  // Every target ignored: the mean is 0 / 0 = NaN on both devices, as PyTorch.
  Tensor all_ignored = full({4}, -100, TensorOptions(kInt64));
  Tensor lp = random_cpu({4, 3}, kFloat32, -3, 0, 44);
  Tensor loss_c = empty({}), total_c = empty({}), loss_g = empty_on({}, kFloat32, kCuda0), total_g = empty_on({}, kFloat32, kCuda0);
  nll_loss_forward_kernel(kCpu)(lp, all_ignored, Tensor(), Reduction::Mean, -100, loss_c, total_c);
  nll_loss_forward_kernel(kCuda0)(gpu(lp), gpu(all_ignored), Tensor(), Reduction::Mean, -100, loss_g, total_g);
  CHECK(std::isnan(host_values(loss_g)[0]));
  check_close("nll_loss all ignored", loss_g, loss_c, 0.0);
}

TEST_CASE("dropout draws the CPU's mask bit for bit from the same generator state" * doctest::skip(!kGpu)) {
  for (DType dtype : {kFloat32, kFloat64}) {
    for (double p : {0.0, 0.1, 0.5, 0.9}) {
      const Tensor x = random_cpu({3, 1001}, dtype, -1, 1, 50);
      Generator cpu_gen(77), gpu_gen(77);
      (void)cpu_gen.reserve(12345);  // a generator part-way through its stream
      (void)gpu_gen.reserve(12345);
      Tensor out_c = empty_on(x.shape(), dtype, kCpu), mask_c = empty_on(x.shape(), dtype, kCpu);
      Tensor out_g = empty_on(x.shape(), dtype, kCuda0), mask_g = empty_on(x.shape(), dtype, kCuda0);
      dropout_kernel(kCpu)(x, p, cpu_gen, out_c, mask_c);
      dropout_kernel(kCuda0)(gpu(x), p, gpu_gen, out_g, mask_g);
      check_close(detail::str("dropout mask ", dtype, " p=", p), mask_g, mask_c, 0.0);
      check_close(detail::str("dropout out ", dtype, " p=", p), out_g, out_c, 0.0);
      CHECK(gpu_gen.offset() == cpu_gen.offset());
    }
  }
}

TEST_CASE("the fused SGD update is bit for bit the CPU's, for every option" * doctest::skip(!kGpu)) {
  struct Options {
    double momentum, dampening, weight_decay;
    bool nesterov, maximize;
  };
  const std::vector<Options> options = {
      {0.0, 0.0, 0.0, false, false}, {0.9, 0.0, 5e-4, false, false}, {0.9, 0.0, 5e-4, true, false},
      {0.8, 0.3, 0.0, false, false}, {0.9, 0.1, 1e-2, false, true},
  };
  for (DType dtype : {kFloat32, kFloat64}) {
    for (const Options& o : options) {
      const std::string where = detail::str(dtype, " momentum ", o.momentum, " dampening ", o.dampening, " wd ",
                                            o.weight_decay, o.nesterov ? " nesterov" : "", o.maximize ? " maximize" : "");
      Tensor p_c = random_cpu({4099}, dtype, -1, 1, 60), p_g = gpu(p_c);
      Tensor buf_c = o.momentum != 0 ? empty_on({4099}, dtype, kCpu) : Tensor();
      Tensor buf_g = o.momentum != 0 ? empty_on({4099}, dtype, kCuda0) : Tensor();
      for (int step = 0; step < 3; ++step) {
        const Tensor g = random_cpu({4099}, dtype, -1, 1, 61 + static_cast<uint64_t>(step));
        const optim::SGDStep s{0.05, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.maximize, step == 0};
        optim::sgd_update_kernel(kCpu)(p_c, g, buf_c, s);
        optim::sgd_update_kernel(kCuda0)(p_g, gpu(g), buf_g, s);
      }
      check_close(where + " param", p_g, p_c, 0.0);
      check_close(where + " momentum buffer", buf_g, buf_c, 0.0);
    }
  }
}

TEST_CASE("Module::to(cuda) moves parameters and buffers, keeping values and identity" * doctest::skip(!kGpu)) {
  auto model = nn::resnet_tiny(10);
  auto before = model->state_dict();
  std::vector<Tensor> cpu_state;
  for (auto& [name, t] : before) cpu_state.push_back(t.clone());
  const std::vector<Tensor> params = model->parameters();
  model->to(kCuda0);
  const std::vector<Tensor> moved = model->parameters();
  REQUIRE(moved.size() == params.size());
  for (size_t i = 0; i < params.size(); ++i) CHECK(moved[i].is_same(params[i]));  // same tensors, new data
  size_t i = 0;
  for (auto& [key, t] : model->state_dict()) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    INFO(name);
    CHECK(t.device() == kCuda0);
    check_close(name, t, cpu_state[i++], 0.0);
  }
}

TEST_CASE("the caching allocator neither grows nor leaks over 1000 training steps" * doctest::skip(!kGpu)) {
  auto model = nn::resnet_tiny(10);
  model->to(kCuda0);
  optim::SGD optimizer(model->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 5e-4});
  nn::CrossEntropyLoss criterion;
  const Tensor images = gpu(random_cpu({16, 3, 32, 32}, kFloat32, -1, 1, 70));
  const Tensor labels = gpu(random_cpu({16}, kInt64, 0, 10, 71));
  auto step = [&] {
    optimizer.zero_grad();
    Tensor loss = criterion((*model)(images), labels);
    loss.backward();
    optimizer.step();
  };
  // Momentum buffers, cuDNN workspaces, handles, and the allocator's free lists settling
  // (a best-fit cache with block splitting may take a few steps to reach its steady state).
  for (int i = 0; i < 10; ++i) step();
  cuda::synchronize(0);
  const AllocatorStats warm = memory_stats(kCuda0);
  for (int i = 0; i < 1000; ++i) step();
  cuda::synchronize(0);
  const AllocatorStats after = memory_stats(kCuda0);
  CHECK(after.allocated_bytes == warm.allocated_bytes);        // nothing leaked
  CHECK(after.system_allocations == warm.system_allocations);  // every block reused
  CHECK(after.reserved_bytes == warm.reserved_bytes);
}

TEST_CASE("a ResNet18 training step on the GPU matches the same step on the CPU" * doctest::skip(!kGpu)) {
  cuda::set_cudnn_allow_tf32(false);  // TF32 would round inputs to 10 bits: not the CPU's math
  manual_seed(80);
  auto cpu_model = nn::resnet18(10);
  auto gpu_model = cpu_model->clone(kCuda0);
  const Tensor images = random_cpu({8, 3, 32, 32}, kFloat32, -2, 2, 81);
  const Tensor labels = random_cpu({8}, kInt64, 0, 10, 82);
  nn::CrossEntropyLoss criterion;
  const optim::SGDOptions options{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true};
  optim::SGD cpu_opt(cpu_model->parameters(), options), gpu_opt(gpu_model->parameters(), options);

  for (int step = 0; step < 2; ++step) {  // the second step uses the momentum buffers
    INFO("step ", step);
    Tensor cpu_logits = (*cpu_model)(images), gpu_logits = (*gpu_model)(gpu(images));
    check_close_scaled("logits", gpu_logits, cpu_logits, 1e-4);
    Tensor cpu_loss = criterion(cpu_logits, labels), gpu_loss = criterion(gpu_logits, gpu(labels));
    check_close("loss", gpu_loss, cpu_loss, 1e-4);
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    cpu_loss.backward();
    gpu_loss.backward();
    auto cpu_params = cpu_model->named_parameters(), gpu_params = gpu_model->named_parameters();
    for (auto& [name, p] : cpu_params) check_close_norm("grad of " + name, gpu_params[name].grad(), p.grad(), 1e-3);
    cpu_opt.step();
    gpu_opt.step();
    auto cpu_state = cpu_model->state_dict(), gpu_state = gpu_model->state_dict();
    for (auto& [name, t] : cpu_state) {
      if (t.dtype() == kInt64) check_close(name, gpu_state[name], t, 0.0);  // num_batches_tracked
      else check_close_scaled(name, gpu_state[name], t, 2e-3);
    }
  }
  cuda::set_cudnn_allow_tf32(true);
}

TEST_CASE("the first GPU matmul maps cuBLAS (it was not mapped at load)" * doctest::skip(!kGpu)) {
  Tensor a = gpu(random_cpu({4, 5}, kFloat32, -1, 1, 90)), b = gpu(random_cpu({5, 3}, kFloat32, -1, 1, 91));
  Tensor c = empty_on({4, 3}, kFloat32, kCuda0);
  mm_kernel(kCuda0)(a, b, 0.0, c);
  cuda::synchronize(0);
  CHECK(library_mapped("libcublas"));
}

}  // TEST_SUITE
