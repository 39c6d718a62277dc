// CPU log_softmax (forward, backward) and nll_loss (forward, backward).
//
// log_softmax works along the last dim of a contiguous [rows, classes] tensor; the
// autograd op moves any other dim there first. Rows are independent, so they are split
// across OpenMP threads. It is computed stably as
//     log_softmax(x)_j = (x_j - max) - log(sum_k exp(x_k - max)),
// so exp never overflows and the largest term of the sum is exactly 1.
//
// nll_loss is PyTorch's: out_i = -weight[t_i] * log_probs[i, t_i], 0 where
// t_i == ignore_index; `sum` adds them, `mean` divides the sum by total_weight =
// sum of weight[t_i] over non-ignored i (the count when there is no weight), and is
// NaN when every target is ignored (0 / 0), as in PyTorch.
#include <cmath>
#include <limits>

#include "core/cpu/contiguous.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

constexpr int64_t kRowGrain = 1 << 14;  // elements below which rows run on one thread

struct Rows {
  int64_t rows, classes;
};

Rows rows_of(const Tensor& t) {
  const int64_t classes = t.dim() == 0 ? 1 : t.size(t.dim() - 1);
  return {classes == 0 ? 0 : t.numel() / classes, classes};
}

void log_softmax_forward_cpu(const Tensor& in_any, Tensor& out) {
  check_output_dense("log_softmax", out);
  const Tensor in = contiguous_input(in_any);
  dispatch_floating(in.dtype(), "log_softmax", [&]<typename T>() {
    // Plain variables, not a structured binding: clang (14 refuses, 16 crashes) cannot
    // capture a binding into the OpenMP region below, and the sanitizer builds use clang.
    const int64_t rows = rows_of(in).rows, classes = rows_of(in).classes;
    const T* x = in.data_ptr<T>();
    T* y = out.data_ptr<T>();
#pragma omp parallel for schedule(static) if (rows * classes > kRowGrain && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * classes;
      T* yr = y + r * classes;
      T max = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : max)
      for (int64_t j = 0; j < classes; ++j) max = xr[j] > max ? xr[j] : max;
      T sum = T(0);
      for (int64_t j = 0; j < classes; ++j) sum += std::exp(xr[j] - max);
      const T log_sum = std::log(sum);
#pragma omp simd
      for (int64_t j = 0; j < classes; ++j) yr[j] = (xr[j] - max) - log_sum;
    }
  });
}

// d log_softmax: grad_in_j = grad_out_j - softmax_j * sum_k grad_out_k, softmax = exp(out).
void log_softmax_backward_cpu(const Tensor& grad_out_any, const Tensor& out_any, Tensor& grad_in) {
  check_output_dense("log_softmax_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  const Tensor out = contiguous_input(out_any);
  dispatch_floating(out.dtype(), "log_softmax_backward", [&]<typename T>() {
    const int64_t rows = rows_of(out).rows, classes = rows_of(out).classes;  // as in the forward
    const T* gy = grad_out.data_ptr<T>();
    const T* y = out.data_ptr<T>();
    T* gx = grad_in.data_ptr<T>();
#pragma omp parallel for schedule(static) if (rows * classes > kRowGrain && rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = r * classes;
      T total = T(0);
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < classes; ++j) total += gy[at + j];
      for (int64_t j = 0; j < classes; ++j) gx[at + j] = gy[at + j] - std::exp(y[at + j]) * total;
    }
  });
}

// Throws for the first target that is neither a class index nor ignore_index. Runs
// before any output is written, on one thread (an exception must not leave an OpenMP
// region).
void check_targets(const int64_t* target, int64_t n, int64_t classes, int64_t ignore_index) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = target[i];
    LOOM_CHECK(t == ignore_index || (t >= 0 && t < classes), "nll_loss: target ", t, " at position ", i,
               " is out of bounds: expected a class index in [0, ", classes, ") for ", classes,
               " classes, or ignore_index (", ignore_index, ")");
  }
}

void nll_loss_forward_cpu(const Tensor& log_probs_any, const Tensor& target_any, const Tensor& weight_any,
                          Reduction reduction, int64_t ignore_index, Tensor& out, Tensor& total_weight) {
  check_output_dense("nll_loss", out);
  const Tensor log_probs = contiguous_input(log_probs_any);
  const Tensor target = contiguous_input(target_any);
  const Tensor weight = contiguous_input(weight_any);
  dispatch_floating(log_probs.dtype(), "nll_loss", [&]<typename T>() {
    const int64_t n = log_probs.size(0), classes = log_probs.size(1);
    const T* lp = log_probs.data_ptr<T>();
    const int64_t* t = target.data_ptr<int64_t>();
    const T* w = weight.defined() ? weight.data_ptr<T>() : nullptr;
    check_targets(t, n, classes, ignore_index);

    // A batch is small (one loss per sample), so one thread; sums accumulate in double.
    double loss_sum = 0, weight_sum = 0;
    T* per_sample = reduction == Reduction::None ? out.data_ptr<T>() : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] == ignore_index) {
        if (per_sample) per_sample[i] = T(0);
        continue;
      }
      const T wi = w ? w[t[i]] : T(1);
      const T loss = -wi * lp[i * classes + t[i]];
      if (per_sample) per_sample[i] = loss;
      loss_sum += static_cast<double>(loss);
      weight_sum += static_cast<double>(wi);
    }
    total_weight.data_ptr<T>()[0] = static_cast<T>(weight_sum);
    if (reduction == Reduction::Sum) out.data_ptr<T>()[0] = static_cast<T>(loss_sum);
    if (reduction == Reduction::Mean) out.data_ptr<T>()[0] = static_cast<T>(loss_sum / weight_sum);
  });
}

void nll_loss_backward_cpu(const Tensor& grad_out_any, const Tensor& target_any, const Tensor& weight_any,
                           Reduction reduction, int64_t ignore_index, const Tensor& total_weight, Tensor& grad_in) {
  check_output_dense("nll_loss_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  const Tensor target = contiguous_input(target_any);
  const Tensor weight = contiguous_input(weight_any);
  dispatch_floating(grad_in.dtype(), "nll_loss_backward", [&]<typename T>() {
    const int64_t n = grad_in.size(0), classes = grad_in.size(1);
    const T* gy = grad_out.data_ptr<T>();
    const int64_t* t = target.data_ptr<int64_t>();
    const T* w = weight.defined() ? weight.data_ptr<T>() : nullptr;
    T* gx = grad_in.data_ptr<T>();
    check_targets(t, n, classes, ignore_index);
    for (int64_t i = 0; i < n * classes; ++i) gx[i] = T(0);
    // Only the target column of each row has a gradient.
    const T scale = reduction == Reduction::Mean ? T(1) / total_weight.data_ptr<T>()[0] : T(1);
    for (int64_t i = 0; i < n; ++i) {
      if (t[i] == ignore_index) continue;
      const T g = reduction == Reduction::None ? gy[i] : gy[0];
      gx[i * classes + t[i]] = -(w ? w[t[i]] : T(1)) * g * scale;
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(log_softmax_forward_kernel, DeviceType::CPU, log_softmax_forward_cpu);
LOOM_REGISTER_KERNEL(log_softmax_backward_kernel, DeviceType::CPU, log_softmax_backward_cpu);
LOOM_REGISTER_KERNEL(nll_loss_forward_kernel, DeviceType::CPU, nll_loss_forward_cpu);
LOOM_REGISTER_KERNEL(nll_loss_backward_kernel, DeviceType::CPU, nll_loss_backward_cpu);

}  // namespace loom::cpu
