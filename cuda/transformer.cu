// CUDA layer norm (forward, backward) and GELU (forward, backward; exact and tanh): the
// GPU twins of core/cpu/layer_norm.cpp and core/cpu/gelu.cpp, with their formulas (the
// Notes there) and their order of rounding wherever it matters:
//
//   layer_norm_rows        one block per row: mean, then the centred sum of squares (two
//                          reads, as the CPU: no E[x^2] - E[x]^2 cancellation), both summed
//                          in double; then y = (x - mean) * rstd * w + b in the compute type
//   layer_norm_grad_rows   one block per row: sum(g), sum(g * xhat) in double, g = dy * w;
//                          dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   layer_norm_grad_params one block per 32 columns: 8 row slices of 32 threads walk the
//                          rows (each a coalesced 128-byte read), double partials combined
//                          in a fixed order: deterministic, and no atomics
//   gelu / gelu_backward   elementwise (gpu_map), the CPU's formulas in the compute type
//
// Results agree with the CPU to float32 rounding, not bit for bit: the CPU sums with SIMD
// lanes and fuses multiply-adds, and CUDA's erfc/exp/tanh are not glibc's. float32 and
// float64 as on the CPU; float16 / bfloat16 (autocast's activations) compute in float,
// with the row statistics mean and rstd in float32 (as PyTorch keeps them).
// The parameter-gradient kernel has few blocks (cols / 32: 6 for ViT-tiny), each walking
// every row; splitting the rows over more blocks with a second combine is the next step
// if it shows in a profile.
#include <algorithm>
#include <limits>

#include "core/kernels.h"
#include "cuda/kernel_utils.cuh"  // defines: block_sum, dense, check_dense_output, optional_data, ceil_div
#include "cuda/loops.cuh"         // defines: gpu_map, dispatch_types, widen, narrow, compute_t, kBlockSize

namespace loom::cuda {
namespace {

// ---- layer norm ---------------------------------------------------------------------------

struct RowsCols {
  int64_t rows, cols;
};

RowsCols rows_cols_of(const Tensor& x) {
  const int64_t cols = x.size(x.dim() - 1);
  return {cols == 0 ? 0 : x.numel() / cols, cols};
}

unsigned row_grid(int64_t rows, int device) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(rows, static_cast<int64_t>(multiprocessor_count(device)) * 32)));
}

// Stat: the type of mean / rstd (compute_t<T>: float for 16-bit inputs).
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    layer_norm_rows(const T* x, const T* w, const T* b, double eps, int64_t rows, int64_t cols, T* y,
                    compute_t<T>* mean_out, compute_t<T>* rstd_out) {
  using Acc = compute_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += static_cast<double>(widen(xr[j]));
    const double mu = block_sum(sum) / static_cast<double>(cols);
    double squares = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const double d = static_cast<double>(widen(xr[j])) - mu;
      squares += d * d;
    }
    const double rs = 1.0 / sqrt(block_sum(squares) / static_cast<double>(cols) + eps);
    const Acc mu_t = static_cast<Acc>(mu), rs_t = static_cast<Acc>(rs);
    if (threadIdx.x == 0) {
      mean_out[r] = mu_t;
      rstd_out[r] = rs_t;
    }
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const Acc xhat = (widen(xr[j]) - mu_t) * rs_t;
      yr[j] = narrow<T>((w ? xhat * widen(w[j]) : xhat) + (b ? widen(b[j]) : Acc(0)));
    }
  }
}

// See Note [Layer norm backward] (core/cpu/layer_norm.cpp).
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    layer_norm_grad_rows(const T* dy, const T* x, const T* w, const compute_t<T>* mean, const compute_t<T>* rstd,
                         int64_t rows, int64_t cols, T* dx) {
  using Acc = compute_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    T* dxr = dx + r * cols;
    const Acc m = mean[r], s = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const Acc g = w ? widen(dyr[j]) * widen(w[j]) : widen(dyr[j]);
      sum_g += static_cast<double>(g);
      sum_gx += static_cast<double>(g) * static_cast<double>((widen(xr[j]) - m) * s);
    }
    const Acc mean_g = static_cast<Acc>(block_sum(sum_g) / static_cast<double>(cols));
    const Acc mean_gx = static_cast<Acc>(block_sum(sum_gx) / static_cast<double>(cols));
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const Acc g = w ? widen(dyr[j]) * widen(w[j]) : widen(dyr[j]);
      dxr[j] = narrow<T>(s * (g - mean_g - (widen(xr[j]) - m) * s * mean_gx));
    }
  }
}

constexpr int kColumns = 32;                     // columns per block of the parameter gradients
constexpr int kRowSlices = kBlockSize / kColumns;  // rows walked at once by one block

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    layer_norm_grad_params(const T* dy, const T* x, const compute_t<T>* mean, const compute_t<T>* rstd, int64_t rows,
                           int64_t cols, T* dw, T* db) {
  using Acc = compute_t<T>;
  __shared__ double part_w[kRowSlices][kColumns], part_b[kRowSlices][kColumns];
  const int lane = threadIdx.x % kColumns, slice = threadIdx.x / kColumns;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + lane;
  double acc_w = 0, acc_b = 0;
  if (j < cols) {
    for (int64_t r = slice; r < rows; r += kRowSlices) {
      const Acc g = widen(dy[r * cols + j]);
      acc_w += static_cast<double>(g * ((widen(x[r * cols + j]) - mean[r]) * rstd[r]));
      acc_b += static_cast<double>(g);
    }
  }
  part_w[slice][lane] = acc_w;
  part_b[slice][lane] = acc_b;
  __syncthreads();
  if (slice == 0 && j < cols) {
    double total_w = 0, total_b = 0;
    for (int k = 0; k < kRowSlices; ++k) {
      total_w += part_w[k][lane];
      total_b += part_b[k][lane];
    }
    if (dw) dw[j] = narrow<T>(static_cast<Acc>(total_w));
    if (db) db[j] = narrow<T>(static_cast<Acc>(total_b));
  }
}

// mean / rstd hold compute_t<T>: T itself, or float32 for 16-bit inputs.
template <typename T>
void check_stats(const char* op, const Tensor& stats, int64_t rows) {
  LOOM_CHECK(stats.dtype() == device_dtype<compute_t<T>>() && stats.numel() == rows && stats.is_contiguous(), op,
             " on CUDA: expected dense row statistics of dtype ", device_dtype<compute_t<T>>(), " and ", rows,
             " elements, got ", stats.str());
}

void layer_norm_forward_cuda(const Tensor& x_any, const Tensor& weight_any, const Tensor& bias_any, double eps,
                             Tensor& out, Tensor& mean, Tensor& rstd) {
  check_dense_output("layer_norm", out);
  const Tensor x = dense(x_any), weight = dense(weight_any), bias = dense(bias_any);
  const auto [rows, cols] = rows_cols_of(x);
  if (rows == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  dispatch_types(FloatAndHalfTypes{}, x.dtype(), "layer_norm", [&]<typename T>() {
    using Acc = compute_t<T>;
    check_stats<T>("layer_norm", mean, rows);
    check_stats<T>("layer_norm", rstd, rows);
    layer_norm_rows<T><<<row_grid(rows, device), kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<const T*>(x.raw_data()), optional_data<T>(weight), optional_data<T>(bias), eps, rows, cols,
        static_cast<T*>(out.raw_data()), static_cast<Acc*>(mean.raw_data()), static_cast<Acc*>(rstd.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH("layer_norm");
  });
}

void layer_norm_backward_cuda(const Tensor& grad_out_any, const Tensor& x_any, const Tensor& weight_any,
                              const Tensor& mean_any, const Tensor& rstd_any, Tensor& grad_x, Tensor& grad_weight,
                              Tensor& grad_bias) {
  check_dense_output("layer_norm_backward", grad_x);
  check_dense_output("layer_norm_backward", grad_weight);
  check_dense_output("layer_norm_backward", grad_bias);
  const Tensor dy = dense(grad_out_any), x = dense(x_any), weight = dense(weight_any);
  const Tensor mean = dense(mean_any), rstd = dense(rstd_any);
  const auto [rows, cols] = rows_cols_of(x);
  const int device = x.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device).handle;
  if (rows == 0) {  // no rows: the parameter gradients are empty sums
    for (Tensor* t : {&grad_weight, &grad_bias})
      if (t->defined() && t->numel() > 0)
        LOOM_CUDA_CHECK(cudaMemsetAsync(t->raw_data(), 0, t->numel() * element_size(t->dtype()), stream),
                        "zeroing layer_norm's parameter gradient ", t->shape());
    return;
  }
  dispatch_types(FloatAndHalfTypes{}, x.dtype(), "layer_norm_backward", [&]<typename T>() {
    using Acc = compute_t<T>;
    check_stats<T>("layer_norm_backward", mean, rows);
    check_stats<T>("layer_norm_backward", rstd, rows);
    const T* dy_p = static_cast<const T*>(dy.raw_data());
    const T* x_p = static_cast<const T*>(x.raw_data());
    const Acc* mean_p = static_cast<const Acc*>(mean.raw_data());
    const Acc* rstd_p = static_cast<const Acc*>(rstd.raw_data());
    if (grad_x.defined()) {
      layer_norm_grad_rows<T><<<row_grid(rows, device), kBlockSize, 0, stream>>>(
          dy_p, x_p, optional_data<T>(weight), mean_p, rstd_p, rows, cols, static_cast<T*>(grad_x.raw_data()));
      LOOM_CUDA_CHECK_LAUNCH("layer_norm_backward (input)");
    }
    if (grad_weight.defined() || grad_bias.defined()) {
      layer_norm_grad_params<T><<<static_cast<unsigned>(ceil_div(cols, kColumns)), kBlockSize, 0, stream>>>(
          dy_p, x_p, mean_p, rstd_p, rows, cols, grad_weight.defined() ? static_cast<T*>(grad_weight.raw_data()) : nullptr,
          grad_bias.defined() ? static_cast<T*>(grad_bias.raw_data()) : nullptr);
      LOOM_CUDA_CHECK_LAUNCH("layer_norm_backward (weight, bias)");
    }
  });
}

// ---- GELU ---------------------------------------------------------------------------------
// The formulas of core/cpu/gelu.cpp, in the compute type.

constexpr double kSqrt1_2 = 0.70710678118654752440;     // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588; // sqrt(2 / pi)
constexpr double kCubic = 0.044715;

template <typename Acc>
__device__ inline Acc gelu_value(Acc x, bool tanh_approximation) {
  if (tanh_approximation) {
    const Acc u = Acc(kSqrt2OverPi) * (x + Acc(kCubic) * x * x * x);
    return Acc(0.5) * x * (Acc(1) + tanh(u));
  }
  return Acc(0.5) * x * erfc(-x * Acc(kSqrt1_2));
}

template <typename Acc>
__device__ inline Acc gelu_derivative(Acc x, bool tanh_approximation) {
  if (tanh_approximation) {
    const Acc x2 = x * x;
    const Acc t = tanh(Acc(kSqrt2OverPi) * (x + Acc(kCubic) * x2 * x));
    const Acc du = Acc(kSqrt2OverPi) * (Acc(1) + Acc(3 * kCubic) * x2);
    return Acc(0.5) * (Acc(1) + t) + Acc(0.5) * x * (Acc(1) - t * t) * du;
  }
  const Acc cdf = Acc(0.5) * erfc(-x * Acc(kSqrt1_2));
  const Acc pdf = Acc(kInvSqrt2Pi) * exp(Acc(-0.5) * x * x);
  return cdf + x * pdf;
}

template <typename T>
struct GeluFn {
  bool tanh_approximation;
  __device__ T operator()(T x) const { return narrow<T>(gelu_value(widen(x), tanh_approximation)); }
};

template <typename T>
struct GeluBackwardFn {
  bool tanh_approximation;
  __device__ T operator()(T g, T x) const {
    return narrow<T>(widen(g) * gelu_derivative(widen(x), tanh_approximation));
  }
};

void gelu_forward_cuda(const Tensor& x, bool tanh_approximation, Tensor& out) {
  dispatch_types(FloatAndHalfTypes{}, x.dtype(), "gelu", [&]<typename T>() {
    gpu_map<T, T>(out, GeluFn<T>{tanh_approximation}, x);
  });
}

void gelu_backward_cuda(const Tensor& grad_out, const Tensor& x, bool tanh_approximation, Tensor& grad_x) {
  dispatch_types(FloatAndHalfTypes{}, x.dtype(), "gelu_backward", [&]<typename T>() {
    gpu_map<T, T, T>(grad_x, GeluBackwardFn<T>{tanh_approximation}, grad_out, x);
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::CUDA, layer_norm_forward_cuda);
LOOM_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::CUDA, layer_norm_backward_cuda);
LOOM_REGISTER_KERNEL(gelu_forward_kernel, DeviceType::CUDA, gelu_forward_cuda);
LOOM_REGISTER_KERNEL(gelu_backward_kernel, DeviceType::CUDA, gelu_backward_cuda);

}  // namespace loom::cuda
