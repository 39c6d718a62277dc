// CPU layer norm, forward and backward, over the last dim of a [rows, cols] tensor.
//
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps), var biased
//
// as torch.nn.functional.layer_norm. Rows are independent and split across threads.
// Statistics accumulate in double whatever the dtype: a transformer's rows are short
// (192 to 768 values), so the cost is nothing, and float32 results then differ from
// PyTorch's by the rounding of the output alone.
//
// Note [Layer norm backward]
// With xhat = (x - mean) * rstd and g = grad_out * weight, the input gradient of one row is
//   grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// two row sums and one pass. The parameter gradients sum over rows:
//   grad_weight = sum_rows grad_out * xhat,   grad_bias = sum_rows grad_out.
// Summed by threads over rows they would need one partial buffer per thread; summed by
// columns they read the rows with stride cols. So threads take blocks of kColumnBlock
// columns and walk every row through that block: each row's block is a few cache lines
// read in order, every sum is in one fixed order (the result does not depend on the
// thread count), and no partial buffers are needed.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/contiguous.h"           // defines: contiguous_input, check_output_dense
#include "core/cpu/transformer_kernels.h"  // declares: layer_norm_forward, layer_norm_backward
#include "core/dtype.h"                    // defines: dispatch_floating
#include "core/kernels.h"                  // declares: layer_norm_forward_kernel, layer_norm_backward_kernel

namespace loom::cpu {
namespace {

constexpr int64_t kRowGrain = 1 << 14;  // elements below which one thread does every row
constexpr int64_t kColumnBlock = 16;    // columns per task of the parameter gradients

int64_t columns_of(const Tensor& x) { return x.size(x.dim() - 1); }

}  // namespace

void layer_norm_forward(const Tensor& x_any, const Tensor& weight_any, const Tensor& bias_any, double eps, Tensor& out,
                        Tensor& mean, Tensor& rstd) {
  check_output_dense("layer_norm", out);
  const Tensor x = contiguous_input(x_any);
  const Tensor weight = contiguous_input(weight_any);
  const Tensor bias = contiguous_input(bias_any);
  dispatch_floating(x.dtype(), "layer_norm", [&]<typename T>() {
    const int64_t cols = columns_of(x);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const T* xp = x.data_ptr<T>();
    const T* w = weight.defined() ? weight.data_ptr<T>() : nullptr;
    const T* b = bias.defined() ? bias.data_ptr<T>() : nullptr;
    T* y = out.data_ptr<T>();
    T* mu_out = mean.data_ptr<T>();
    T* rs_out = rstd.data_ptr<T>();
#pragma omp parallel for schedule(static) if (rows * cols > kRowGrain && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = xp + r * cols;
      T* yr = y + r * cols;
      double sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j) sum += static_cast<double>(xr[j]);
      const double mu = sum / static_cast<double>(cols);
      double squares = 0;  // two passes: no cancellation for rows far from zero
#pragma omp simd reduction(+ : squares)
      for (int64_t j = 0; j < cols; ++j) {
        const double d = static_cast<double>(xr[j]) - mu;
        squares += d * d;
      }
      const double rs = 1.0 / std::sqrt(squares / static_cast<double>(cols) + eps);
      mu_out[r] = static_cast<T>(mu);
      rs_out[r] = static_cast<T>(rs);
      const T mu_t = static_cast<T>(mu), rs_t = static_cast<T>(rs);
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        const T xhat = (xr[j] - mu_t) * rs_t;
        yr[j] = (w ? xhat * w[j] : xhat) + (b ? b[j] : T(0));
      }
    }
  });
}

// See Note [Layer norm backward].
void layer_norm_backward(const Tensor& grad_out_any, const Tensor& x_any, const Tensor& weight_any,
                         const Tensor& mean, const Tensor& rstd, Tensor& grad_x, Tensor& grad_weight,
                         Tensor& grad_bias) {
  check_output_dense("layer_norm_backward", grad_x);
  check_output_dense("layer_norm_backward", grad_weight);
  check_output_dense("layer_norm_backward", grad_bias);
  const Tensor dy_t = contiguous_input(grad_out_any);
  const Tensor x = contiguous_input(x_any);
  const Tensor weight = contiguous_input(weight_any);
  dispatch_floating(x.dtype(), "layer_norm_backward", [&]<typename T>() {
    const int64_t cols = columns_of(x);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const T* dy = dy_t.data_ptr<T>();
    const T* xp = x.data_ptr<T>();
    const T* w = weight.defined() ? weight.data_ptr<T>() : nullptr;
    const T* mu = mean.data_ptr<T>();
    const T* rs = rstd.data_ptr<T>();
    if (grad_x.defined()) {
      T* dx = grad_x.data_ptr<T>();
#pragma omp parallel for schedule(static) if (rows * cols > kRowGrain && rows > 1)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = xp + r * cols;
        const T* dyr = dy + r * cols;
        T* dxr = dx + r * cols;
        const T m = mu[r], s = rs[r];
        double sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t j = 0; j < cols; ++j) {
          const double g = static_cast<double>(w ? dyr[j] * w[j] : dyr[j]);
          sum_g += g;
          sum_gx += g * static_cast<double>((xr[j] - m) * s);
        }
        const T mean_g = static_cast<T>(sum_g / static_cast<double>(cols));
        const T mean_gx = static_cast<T>(sum_gx / static_cast<double>(cols));
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) {
          const T g = w ? dyr[j] * w[j] : dyr[j];
          dxr[j] = s * (g - mean_g - (xr[j] - m) * s * mean_gx);
        }
      }
    }
    if (!grad_weight.defined() && !grad_bias.defined()) return;
    T* dw = grad_weight.defined() ? grad_weight.data_ptr<T>() : nullptr;
    T* db = grad_bias.defined() ? grad_bias.data_ptr<T>() : nullptr;
    const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols > kRowGrain && blocks > 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t j0 = blk * kColumnBlock, width = std::min(kColumnBlock, cols - j0);
      double acc_w[kColumnBlock] = {}, acc_b[kColumnBlock] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = xp + r * cols + j0;
        const T* dyr = dy + r * cols + j0;
        const T m = mu[r], s = rs[r];
        for (int64_t j = 0; j < width; ++j) {
          acc_w[j] += static_cast<double>(dyr[j] * ((xr[j] - m) * s));
          acc_b[j] += static_cast<double>(dyr[j]);
        }
      }
      for (int64_t j = 0; j < width; ++j) {
        if (dw) dw[j0 + j] = static_cast<T>(acc_w[j]);
        if (db) db[j0 + j] = static_cast<T>(acc_b[j]);
      }
    }
  });
}

LOOM_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::CPU, layer_norm_forward);
LOOM_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::CPU, layer_norm_backward);

}  // namespace loom::cpu

namespace loom {
// The stubs live beside their CPU kernels (core/kernels.h, "transformer kernels").
LOOM_DEFINE_KERNEL(layer_norm_forward_kernel);
LOOM_DEFINE_KERNEL(layer_norm_backward_kernel);
}  // namespace loom
