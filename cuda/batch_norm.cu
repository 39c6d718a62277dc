// CUDA batch normalisation, forward (training and eval) and backward: the GPU twin of
// core/cpu/batch_norm.cpp, with its fused epilogue (Note [Fused BatchNorm epilogue],
// autograd/ops/nn.cpp): out = max(0, bn(x) + residual), the ReLU's mask applied to the
// incoming gradient in the backward, and the residual's gradient written on the way.
//
// Note [Hand-written batch norm on the GPU]
// cuDNN has batch norm (cudnnBatchNormalizationForwardTraining, and the fused
// BN + add + ReLU of cudnnBatchNormalizationForwardTrainingEx), but the fused variant
// only takes NHWC half-precision tensors, the plain one would need two more passes over
// memory for the epilogue, and neither writes the eval-mode statistics into save_mean /
// save_invstd as core/kernels.h requires. Hand-written, the kernels mirror the CPU's
// passes one for one, so their semantics (biased variance for normalising, unbiased
// for running_var, PyTorch's momentum rule, eps inside the square root) are visibly
// the same:
//
//   forward, training   channel_stats:   one block per channel: mean, then centred sum of
//                       squares (two reads; never E[x^2] - E[x]^2, which cancels), running
//                       stats update, save_mean / save_invstd, per-channel scale and shift
//   forward, eval       eval_stats:      one thread per channel, from the running stats
//   forward             apply:           y = x * scale[c] + shift[c] (+ r), max(0, .)
//   backward            backward_reduce: one block per channel: sum(g), sum(g * (x - mean))
//                       with g = dy masked by the ReLU (and written out as the residual's
//                       gradient), grad_weight, grad_bias, and dx's coefficients
//                       backward_apply:  dx = a[c] * g + b[c] * x + c0[c]
//
// Statistics accumulate in double (the CPU combines its per-plane partial sums in
// double), so float results agree with the CPU to ~1e-6 relative, not bit for bit.
// One block per channel leaves SMs idle when C is small (64 channels on 132 SMs): the
// obvious next step is splitting each channel over several blocks with a second combine.
#include "core/kernels.h"
#include "cuda/kernel_utils.cuh"  // defines: block_sum, dense, check_dense_output, optional_data
#include "cuda/loops.cuh"         // defines: dispatch_types, widen, narrow, grid_size

namespace loom::cuda {
namespace {

struct Layout {
  int64_t n, c, s;  // input viewed as [n, c, s]
  __host__ __device__ int64_t count() const { return n * s; }  // elements per channel
  __host__ __device__ int64_t numel() const { return n * c * s; }
};

Layout layout_of(const Tensor& in) {
  LOOM_CHECK(in.dim() >= 2, "batch_norm kernel: expected an input [N, C, ...], got ", in.shape());
  Layout l{in.size(0), in.size(1), 1};
  for (int64_t d = 2; d < in.dim(); ++d) l.s *= in.size(d);
  return l;
}

// Element j of channel c (j over the channel's n*s elements) in the dense [n, c, s] input.
__device__ inline int64_t channel_element(const Layout& l, int64_t c, int64_t j) {
  const int64_t n = j / l.s;
  return (n * l.c + c) * l.s + (j - n * l.s);
}

// Channel c's statistics, saved for the backward when asked, and folded into
// y = x * scale + shift: coef[c] = scale, coef[C + c] = shift.
template <typename T>
__device__ inline void save_and_fold(Layout l, int64_t c, double mean, double invstd, const T* w, const T* b,
                                     T* save_mean, T* save_invstd, compute_t<T>* coef) {
  using Acc = compute_t<T>;
  if (save_mean) save_mean[c] = narrow<T>(static_cast<Acc>(mean));
  if (save_invstd) save_invstd[c] = narrow<T>(static_cast<Acc>(invstd));
  const Acc scale = static_cast<Acc>(invstd) * (w ? widen(w[c]) : Acc(1));
  coef[c] = scale;
  coef[l.c + c] = (b ? widen(b[c]) : Acc(0)) - static_cast<Acc>(mean) * scale;
}

// Forward, training: one block per channel. `coef` receives scale[c] and shift[c] (the
// normalisation folded into one multiply-add, as the CPU) at coef[c] and coef[C + c].
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    channel_stats(Layout l, const T* x, const T* w, const T* b, T* running_mean, T* running_var, double momentum,
                  double eps, T* save_mean, T* save_invstd, compute_t<T>* coef) {
  using Acc = compute_t<T>;
  const int64_t count = l.count();
  for (int64_t c = blockIdx.x; c < l.c; c += gridDim.x) {
    double sum = 0;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) sum += static_cast<double>(widen(x[channel_element(l, c, j)]));
    const double mean = block_sum(sum) / static_cast<double>(count);
    double squares = 0;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      const double d = static_cast<double>(widen(x[channel_element(l, c, j)])) - mean;
      squares += d * d;
    }
    squares = block_sum(squares);
    if (threadIdx.x == 0) {
      const double invstd = 1.0 / sqrt(squares / static_cast<double>(count) + eps);
      if (running_mean) {
        running_mean[c] = narrow<T>(static_cast<Acc>((1 - momentum) * static_cast<double>(widen(running_mean[c])) + momentum * mean));
      }
      if (running_var) {  // unbiased, as PyTorch
        const double unbiased = squares / static_cast<double>(count - 1);
        running_var[c] = narrow<T>(static_cast<Acc>((1 - momentum) * static_cast<double>(widen(running_var[c])) + momentum * unbiased));
      }
      save_and_fold(l, c, mean, invstd, w, b, save_mean, save_invstd, coef);
    }
  }
}

// Forward, eval: the running statistics are the ones used, and saved for the backward.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    eval_stats(Layout l, const T* w, const T* b, const T* running_mean, const T* running_var, double eps, T* save_mean,
               T* save_invstd, compute_t<T>* coef) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= l.c) return;
  const double mean = static_cast<double>(widen(running_mean[c]));
  const double invstd = 1.0 / sqrt(static_cast<double>(widen(running_var[c])) + eps);
  save_and_fold(l, c, mean, invstd, w, b, save_mean, save_invstd, coef);
}

// y = x * scale[c] + shift[c] (+ r), then max(0, .) when relu (as UnaryOp::Relu).
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    apply(Layout l, const T* x, const compute_t<T>* coef, const T* residual, bool relu, T* y) {
  using Acc = compute_t<T>;
  const int64_t n = l.numel(), step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = (i / l.s) % l.c;
    Acc v = widen(x[i]) * coef[c] + coef[l.c + c];
    if (residual) v += widen(residual[i]);
    if (relu) v = v > Acc(0) ? v : Acc(0);
    y[i] = narrow<T>(v);
  }
}

// The gradient reaching the normalisation: dy, masked where the fused ReLU's output y <= 0.
template <typename T>
__device__ inline compute_t<T> masked_grad(const T* dy, const T* y, int64_t i) {
  using Acc = compute_t<T>;
  if (y != nullptr && !(widen(y[i]) > Acc(0))) return Acc(0);
  return widen(dy[i]);
}

// Backward pass 1, one block per channel; `coef` receives dx's a, b, c0 at
// coef[c], coef[C + c], coef[2C + c] (the CPU's formulas, in double).
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    backward_reduce(Layout l, const T* dy, const T* y, const T* x, const T* w, const T* mean, const T* invstd,
                    bool training, bool need_sums, T* grad_residual, T* grad_weight, T* grad_bias, compute_t<T>* coef) {
  using Acc = compute_t<T>;
  const int64_t count = l.count();
  for (int64_t c = blockIdx.x; c < l.c; c += gridDim.x) {
    const double m = static_cast<double>(widen(mean[c]));
    double sum_dy = 0, dot = 0;
    if (need_sums) {
      for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
        const int64_t i = channel_element(l, c, j);
        const Acc g = masked_grad(dy, y, i);
        if (grad_residual) grad_residual[i] = narrow<T>(g);
        sum_dy += static_cast<double>(g);
        dot += static_cast<double>(g) * (static_cast<double>(widen(x[i])) - m);
      }
      sum_dy = block_sum(sum_dy);
      dot = block_sum(dot);
    }
    if (threadIdx.x == 0) {
      const double inv = static_cast<double>(widen(invstd[c]));
      if (grad_weight) grad_weight[c] = narrow<T>(static_cast<Acc>(dot * inv));
      if (grad_bias) grad_bias[c] = narrow<T>(static_cast<Acc>(sum_dy));
      // Training: dx = (g - mean(g) - (x - mean) * k) * invstd * w with
      // k = dot * invstd^2 / count; eval: dx = g * invstd * w (see the CPU kernel).
      const double wi = inv * (w ? static_cast<double>(widen(w[c])) : 1.0);
      const double k = training ? dot * inv * inv / static_cast<double>(count) : 0.0;
      const double mean_dy = training ? sum_dy / static_cast<double>(count) : 0.0;
      coef[c] = static_cast<Acc>(wi);
      coef[l.c + c] = static_cast<Acc>(-k * wi);
      coef[2 * l.c + c] = static_cast<Acc>((m * k - mean_dy) * wi);
    }
  }
}

// Backward pass 2: dx = a[c] * g + b[c] * x + c0[c], g read from the residual's gradient
// when pass 1 wrote it there, else from dy through the mask.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    backward_apply(Layout l, const T* dy, const T* y, const T* g_written, const T* x, const compute_t<T>* coef, T* dx) {
  using Acc = compute_t<T>;
  const int64_t n = l.numel(), step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = (i / l.s) % l.c;
    const Acc g = g_written ? widen(g_written[i]) : masked_grad(dy, y, i);
    dx[i] = narrow<T>(coef[c] * g + coef[l.c + c] * widen(x[i]) + coef[2 * l.c + c]);
  }
}

unsigned channel_blocks(int64_t channels) { return static_cast<unsigned>(std::min<int64_t>(channels, 65535)); }

template <typename T>
T* optional_out(Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

// Per-channel coefficients in the arithmetic type, from the caching allocator.
template <typename T>
Tensor coefficients(int64_t count, Device device) {
  return empty({count}, TensorOptions(device_dtype<compute_t<T>>()).device(device));
}

void batch_norm_forward_cuda(const Tensor& in_any, const Tensor& weight_any, const Tensor& bias_any,
                             Tensor& running_mean, Tensor& running_var, bool training, double momentum, double eps,
                             const Tensor& residual_any, bool relu, Tensor& out, Tensor& save_mean, Tensor& save_invstd) {
  check_dense_output("batch_norm", out);
  check_dense_output("batch_norm", save_mean);
  check_dense_output("batch_norm", save_invstd);
  LOOM_CHECK(training || (running_mean.defined() && running_var.defined()),
             "batch_norm kernel: eval mode needs running_mean and running_var");
  LOOM_CHECK((!running_mean.defined() || running_mean.is_contiguous()) &&
                 (!running_var.defined() || running_var.is_contiguous()),
             "batch_norm on CUDA: running_mean / running_var must be contiguous (they are updated in place)");
  const Tensor in = dense(in_any), weight = dense(weight_any), bias = dense(bias_any), residual = dense(residual_any);
  const Layout l = layout_of(in);
  if (l.c == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device).handle;
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "batch_norm", [&]<typename T>() {
    Tensor coef = coefficients<T>(2 * l.c, out.device());
    auto* coef_ptr = static_cast<compute_t<T>*>(coef.raw_data());
    if (training) {
      LOOM_CHECK(l.count() > 0, "batch_norm: training needs at least one value per channel, got input ", in.shape());
      channel_stats<T><<<channel_blocks(l.c), kBlockSize, 0, stream>>>(
          l, static_cast<const T*>(in.raw_data()), optional_data<T>(weight), optional_data<T>(bias),
          optional_out<T>(running_mean), optional_out<T>(running_var), momentum, eps, optional_out<T>(save_mean),
          optional_out<T>(save_invstd), coef_ptr);
      LOOM_CUDA_CHECK_LAUNCH("batch_norm statistics");
    } else {
      eval_stats<T><<<static_cast<unsigned>(ceil_div(l.c, kBlockSize)), kBlockSize, 0, stream>>>(
          l, optional_data<T>(weight), optional_data<T>(bias), optional_data<T>(running_mean),
          optional_data<T>(running_var), eps, optional_out<T>(save_mean), optional_out<T>(save_invstd), coef_ptr);
      LOOM_CUDA_CHECK_LAUNCH("batch_norm eval statistics");
    }
    if (l.numel() == 0) return;
    apply<T><<<grid_size(l.numel(), device), kBlockSize, 0, stream>>>(
        l, static_cast<const T*>(in.raw_data()), coef_ptr, optional_data<T>(residual), relu,
        static_cast<T*>(out.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH("batch_norm");
  });
}

void batch_norm_backward_cuda(const Tensor& grad_out_any, const Tensor& in_any, const Tensor& weight_any,
                              const Tensor& save_mean_any, const Tensor& save_invstd_any, bool training,
                              const Tensor& relu_out_any, Tensor& grad_in, Tensor& grad_weight, Tensor& grad_bias,
                              Tensor& grad_residual) {
  for (const Tensor* t : {&grad_in, &grad_weight, &grad_bias, &grad_residual}) check_dense_output("batch_norm_backward", *t);
  const Tensor in = dense(in_any), grad_out = dense(grad_out_any), weight = dense(weight_any);
  const Tensor save_mean = dense(save_mean_any), save_invstd = dense(save_invstd_any), relu_out = dense(relu_out_any);
  const Layout l = layout_of(in);
  if (l.c == 0) return;
  const int device = in.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device).handle;
  // As the CPU: eval-mode dx alone needs no sums.
  const bool need_sums = grad_weight.defined() || grad_bias.defined() || (grad_in.defined() && training) ||
                         grad_residual.defined();
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "batch_norm_backward", [&]<typename T>() {
    Tensor coef = coefficients<T>(3 * l.c, in.device());
    auto* coef_ptr = static_cast<compute_t<T>*>(coef.raw_data());
    const T* dy = static_cast<const T*>(grad_out.raw_data());
    const T* y = optional_data<T>(relu_out);
    const T* x = static_cast<const T*>(in.raw_data());
    T* g_written = optional_out<T>(grad_residual);
    backward_reduce<T><<<channel_blocks(l.c), kBlockSize, 0, stream>>>(
        l, dy, y, x, optional_data<T>(weight), static_cast<const T*>(save_mean.raw_data()),
        static_cast<const T*>(save_invstd.raw_data()), training, need_sums, g_written, optional_out<T>(grad_weight),
        optional_out<T>(grad_bias), coef_ptr);
    LOOM_CUDA_CHECK_LAUNCH("batch_norm_backward reduction");
    if (!grad_in.defined() || l.numel() == 0) return;
    backward_apply<T><<<grid_size(l.numel(), device), kBlockSize, 0, stream>>>(l, dy, y, g_written, x, coef_ptr,
                                                                              static_cast<T*>(grad_in.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH("batch_norm_backward");
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(batch_norm_forward_kernel, DeviceType::CUDA, batch_norm_forward_cuda);
LOOM_REGISTER_KERNEL(batch_norm_backward_kernel, DeviceType::CUDA, batch_norm_backward_cuda);

}  // namespace loom::cuda
