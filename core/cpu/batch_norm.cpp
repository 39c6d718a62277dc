// CPU batch normalisation, forward (training and eval) and backward.
//
// The input is viewed as [N, C, S] (S = H*W for BatchNorm2d, 1 for BatchNorm1d on
// [N, C]): channel c owns N runs of S contiguous elements. Every statistic is per
// channel, so channels are split across OpenMP threads and each thread does all the
// work of its channels while their data is hot in its cache:
//
//   forward, training   pass 1: mean           pass 2: centred sum of squares
//                       pass 3: y = x * scale + shift
//   forward, eval       pass 3 only, with the running statistics
//   backward            pass 1: sum(dy), sum(dy * (x - mean))   pass 2: dx
//
// Note [Batch-norm accumulation]
// Each run of S elements is summed in T with a vectorised loop (short, so float is
// accurate there), and the runs are added in double. The variance is computed from
// centred values (a second pass, not E[x^2] - E[x]^2), so a large mean cannot cancel
// the variance away. Results match PyTorch to float rounding.
//
// Semantics are PyTorch's: normalise with the biased batch variance; update
// running_var with the unbiased one; running = (1 - momentum) * running + momentum * batch.
// In eval, save_mean / save_invstd receive the running statistics actually used, so
// backward needs no access to the (mutable) running buffers.
#include <cmath>
#include <vector>

#include "core/cpu/contiguous.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

struct ChannelLayout {
  int64_t n, c, s;  // input viewed as [n, c, s]
  int64_t count() const { return n * s; }
};

ChannelLayout layout_of(const Tensor& in) {
  LOOM_CHECK(in.dim() >= 2, "batch_norm kernel: expected an input [N, C, ...], got ", in.shape());
  ChannelLayout l{in.size(0), in.size(1), 1};
  for (int64_t d = 2; d < in.dim(); ++d) l.s *= in.size(d);
  return l;
}

// Optional per-channel parameter: the tensor's values, or `fallback` when undefined.
template <typename T>
class PerChannel {
 public:
  PerChannel(const Tensor& t, T fallback) : p_(t.defined() ? t.data_ptr<T>() : nullptr), fallback_(fallback) {}
  T operator[](int64_t c) const { return p_ ? p_[c] : fallback_; }

 private:
  const T* p_;
  T fallback_;
};

// The sum over channel c's N runs of run_sum(offset of the run), which sums one run in T.
// See Note [Batch-norm accumulation].
template <typename RunSum>
double channel_sum(const ChannelLayout& l, int64_t c, RunSum run_sum) {
  double total = 0;
  for (int64_t n = 0; n < l.n; ++n) total += static_cast<double>(run_sum((n * l.c + c) * l.s));
  return total;
}

template <typename T>
void batch_norm_forward_typed(const Tensor& in, const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                              Tensor& running_var, bool training, double momentum, double eps, Tensor& out,
                              Tensor& save_mean, Tensor& save_invstd) {
  const ChannelLayout l = layout_of(in);
  const T* x = in.data_ptr<T>();
  T* y = out.data_ptr<T>();
  const PerChannel<T> w(weight, T(1)), b(bias, T(0));
  T* rm = running_mean.defined() ? running_mean.data_ptr<T>() : nullptr;
  T* rv = running_var.defined() ? running_var.data_ptr<T>() : nullptr;
  T* sm = save_mean.defined() ? save_mean.data_ptr<T>() : nullptr;
  T* si = save_invstd.defined() ? save_invstd.data_ptr<T>() : nullptr;
  const int64_t S = l.s;
  const double count = static_cast<double>(l.count());

#pragma omp parallel for schedule(static) if (l.n * l.c * l.s > 32768 && l.c > 1)
  for (int64_t c = 0; c < l.c; ++c) {
    double mean, invstd;
    if (training) {
      mean = channel_sum(l, c, [&](int64_t at) {
               T part = T(0);
#pragma omp simd reduction(+ : part)
               for (int64_t i = 0; i < S; ++i) part += x[at + i];
               return part;
             }) / count;
      const T mean_t = static_cast<T>(mean);
      const double centred_squares = channel_sum(l, c, [&](int64_t at) {
        T part = T(0);
#pragma omp simd reduction(+ : part)
        for (int64_t i = 0; i < S; ++i) part += (x[at + i] - mean_t) * (x[at + i] - mean_t);
        return part;
      });
      invstd = 1.0 / std::sqrt(centred_squares / count + eps);
      if (rm) rm[c] = static_cast<T>((1 - momentum) * static_cast<double>(rm[c]) + momentum * mean);
      if (rv) {
        const double unbiased = centred_squares / (count - 1);
        rv[c] = static_cast<T>((1 - momentum) * static_cast<double>(rv[c]) + momentum * unbiased);
      }
    } else {
      mean = static_cast<double>(rm[c]);
      invstd = 1.0 / std::sqrt(static_cast<double>(rv[c]) + eps);
    }
    if (sm) sm[c] = static_cast<T>(mean);
    if (si) si[c] = static_cast<T>(invstd);

    // y = (x - mean) * invstd * w + b, folded into one multiply-add per element.
    const T scale = static_cast<T>(invstd) * w[c];
    const T shift = b[c] - static_cast<T>(mean) * scale;
    for (int64_t n = 0; n < l.n; ++n) {
      const int64_t at = (n * l.c + c) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; ++i) y[at + i] = x[at + i] * scale + shift;
    }
  }
}

void batch_norm_forward_cpu(const Tensor& in_any, const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                            Tensor& running_var, bool training, double momentum, double eps, Tensor& out,
                            Tensor& save_mean, Tensor& save_invstd) {
  check_output_dense("batch_norm", out);
  LOOM_CHECK(training || (running_mean.defined() && running_var.defined()),
             "batch_norm kernel: eval mode needs running_mean and running_var");
  const Tensor in = contiguous_input(in_any);
  dispatch_floating(in.dtype(), "batch_norm", [&]<typename T>() {
    batch_norm_forward_typed<T>(in, contiguous_input(weight), contiguous_input(bias), running_mean, running_var,
                                training, momentum, eps, out, save_mean, save_invstd);
  });
}

template <typename T>
void batch_norm_backward_typed(const Tensor& grad_out, const Tensor& in, const Tensor& weight, const Tensor& save_mean,
                               const Tensor& save_invstd, bool training, Tensor& grad_in, Tensor& grad_weight,
                               Tensor& grad_bias) {
  const ChannelLayout l = layout_of(in);
  const T* x = in.data_ptr<T>();
  const T* dy = grad_out.data_ptr<T>();
  const T* mean = save_mean.data_ptr<T>();
  const T* invstd = save_invstd.data_ptr<T>();
  const PerChannel<T> w(weight, T(1));
  T* dx = grad_in.defined() ? grad_in.data_ptr<T>() : nullptr;
  T* dw = grad_weight.defined() ? grad_weight.data_ptr<T>() : nullptr;
  T* db = grad_bias.defined() ? grad_bias.data_ptr<T>() : nullptr;
  const int64_t S = l.s;
  const double count = static_cast<double>(l.count());
  // Eval-mode dx ignores the sums; skip pass 1 when nothing else needs it.
  const bool need_sums = dw || db || (dx && training);

#pragma omp parallel for schedule(static) if (l.n * l.c * l.s > 32768 && l.c > 1)
  for (int64_t c = 0; c < l.c; ++c) {
    const T m = mean[c];
    double sum_dy = 0, dot = 0;  // sum(dy), sum(dy * (x - mean))
    if (need_sums) {
      for (int64_t n = 0; n < l.n; ++n) {
        const int64_t at = (n * l.c + c) * S;
        T part_dy = T(0), part_dot = T(0);
#pragma omp simd reduction(+ : part_dy, part_dot)
        for (int64_t i = 0; i < S; ++i) {
          part_dy += dy[at + i];
          part_dot += dy[at + i] * (x[at + i] - m);
        }
        sum_dy += static_cast<double>(part_dy);
        dot += static_cast<double>(part_dot);
      }
    }
    const double inv = static_cast<double>(invstd[c]);
    if (dw) dw[c] = static_cast<T>(dot * inv);
    if (db) db[c] = static_cast<T>(sum_dy);
    if (!dx) continue;

    // Training: dx = (dy - mean(dy) - (x - mean) * k) * invstd * w, k = dot * invstd^2 / count,
    // the batch statistics' own dependence on x. Folded into dx = a*dy + b*x + c0.
    // Eval: the statistics are constants, so dx = dy * invstd * w.
    const double wi = inv * static_cast<double>(w[c]);
    const double k = training ? dot * inv * inv / count : 0.0;
    const double mean_dy = training ? sum_dy / count : 0.0;
    const T a = static_cast<T>(wi);
    const T bx = static_cast<T>(-k * wi);
    const T c0 = static_cast<T>((static_cast<double>(m) * k - mean_dy) * wi);
    for (int64_t n = 0; n < l.n; ++n) {
      const int64_t at = (n * l.c + c) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; ++i) dx[at + i] = a * dy[at + i] + bx * x[at + i] + c0;
    }
  }
}

void batch_norm_backward_cpu(const Tensor& grad_out_any, const Tensor& in_any, const Tensor& weight,
                             const Tensor& save_mean, const Tensor& save_invstd, bool training, Tensor& grad_in,
                             Tensor& grad_weight, Tensor& grad_bias) {
  check_output_dense("batch_norm_backward", grad_in);
  const Tensor in = contiguous_input(in_any);
  const Tensor grad_out = contiguous_input(grad_out_any);
  dispatch_floating(in.dtype(), "batch_norm_backward", [&]<typename T>() {
    batch_norm_backward_typed<T>(grad_out, in, contiguous_input(weight), contiguous_input(save_mean),
                                 contiguous_input(save_invstd), training, grad_in, grad_weight, grad_bias);
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(batch_norm_forward_kernel, DeviceType::CPU, batch_norm_forward_cpu);
LOOM_REGISTER_KERNEL(batch_norm_backward_kernel, DeviceType::CPU, batch_norm_backward_cpu);

}  // namespace loom::cpu
