// CPU batch normalisation, forward (training and eval) and backward.
//
// The input is viewed as [N, C, S] (S = H*W for BatchNorm2d, 1 for BatchNorm1d on
// [N, C]): N*C *planes* of S contiguous elements, plane p belonging to channel p % C.
// Every kernel streams through memory plane by plane, in order, with planes split
// across OpenMP threads; per-channel results are combined from small per-plane
// partials in between:
//
//   forward, training   pass 1 (read x):      per-plane sum and centred sum of squares
//                       combine per channel:  mean, variance, running-stat update
//                       pass 2 (read x, write y): y = x * scale[c] + shift[c]
//   forward, eval       pass 2 only, with the running statistics
//   backward            pass 1 (read dy, x):  per-plane sum(dy), sum(dy * (x - mean))
//                       pass 2 (read dy, x, write dx)
//
// The fused epilogue (Note [Fused BatchNorm epilogue], autograd/ops/nn.cpp) rides along
// in pass 2 of the forward, y = max(0, x * scale[c] + shift[c] + r), and in the backward
// dy is read through the ReLU's mask (y > 0): pass 1 also writes the masked dy when the
// residual needs it as its gradient, and pass 2 then reads that instead of dy and y.
//
// Streaming in memory order (rather than walking each channel's N planes, 4 KiB apart
// in a ResNet activation) keeps the hardware prefetchers busy and touches each byte
// once per pass: on a [128, 64, 32, 32] float32 tensor this is ~2x faster.
//
// A channels-last input (Note [Channels-last activations], core/memory_format.h) has no
// planes: its passes walk [N*H*W, C] rows instead (core/cpu/batch_norm_channels_last.h),
// and the output and every gradient share the input's format.
//
// Note [Batch-norm accumulation]
// A plane's sums run in T over four vectors' worth of independent accumulators (fast,
// and on <= a few thousand elements as accurate as float needs); planes are combined in
// double. The variance never uses E[x^2] - E[x]^2, which cancels when |mean| >> std:
// each plane p sums squares about its own centre c_p (its float mean), and the
// channel's centred sum of squares follows exactly from
//     sum (x - m)^2 = sum_p [ Q_p + 2 (c_p - m) (sum_p - S c_p) + S (c_p - m)^2 ],
// with Q_p = sum_{x in p} (x - c_p)^2 and sum_p = sum_{x in p} x.
//
// Semantics are PyTorch's: normalise with the biased batch variance; update
// running_var with the unbiased one; running = (1 - momentum) * running + momentum * batch.
// In eval, save_mean / save_invstd receive the running statistics actually used, so
// backward needs no access to the (mutable) running buffers.
//
// Note [Mixed-precision batch norm on the CPU]
// Under CPU autocast the convolutions produce bfloat16 activations while the module's
// weight, bias and running statistics stay float32 (PyTorch's CPU autocast lists no
// batch_norm; its CPU kernel takes "bfloat16 input, float32 parameters" as here). So
// every kernel below has two types: E, the activations' element type (x, y, dy, dx,
// residual, the ReLU's output), and T = compute_t<E>, the type of the parameters, the
// statistics, save_mean / save_invstd, grad_weight / grad_bias and all arithmetic.
// E = T for float and double; for E = bfloat16, T = float: each element is widened as
// it is loaded and rounded once as it is stored (Note [bfloat16 conversion in
// registers]), the sums run in float and combine in double exactly as for float32
// input, and the passes move half the bytes. The fused epilogue rounds once, after
// bn(x) + r and the ReLU, where the separate ops would round after each (so bfloat16
// results agree with the unfused composition to bfloat16 rounding, not to the bit).
// float16 input (CPU autocast with float16) takes the same path, E = Half, with
// scalar conversions.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "core/cpu/bf16_convert.h"  // defines: compute_t, widen, narrow_into, dispatch_floating_16bit
#include "core/cpu/batch_norm_channels_last.h"  // defines: channels_last:: passes (rows instead of planes)
#include "core/cpu/contiguous.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

constexpr int64_t kBatchNormGrain = 1 << 15;  // elements below which one thread does it all

struct PlaneLayout {
  int64_t n, c, s;  // input viewed as [n, c, s]
  int64_t planes() const { return n * c; }
  int64_t count() const { return n * s; }  // elements per channel
};

PlaneLayout layout_of(const Tensor& in) {
  LOOM_CHECK(in.dim() >= 2, "batch_norm kernel: expected an input [N, C, ...], got ", in.shape());
  PlaneLayout l{in.size(0), in.size(1), 1};
  for (int64_t d = 2; d < in.dim(); ++d) l.s *= in.size(d);
  return l;
}

// Values of an optional per-channel tensor, or `fallback` for each channel.
template <typename T>
std::vector<T> per_channel(const Tensor& t, int64_t channels, T fallback) {
  if (!t.defined()) return std::vector<T>(static_cast<size_t>(channels), fallback);
  const T* p = t.data_ptr<T>();
  return std::vector<T>(p, p + channels);
}

// sum_{i < n} term(i), vectorised with independent accumulators so the adds do not
// wait on each other; a short run (small H*W) is one vectorised reduction. See
// Note [Batch-norm accumulation].
template <typename T, typename Term>
inline T sum_run(int64_t n, Term term) {
  constexpr int64_t kLanes = 4 * 64 / static_cast<int64_t>(sizeof(T));
  T total = T(0);
  int64_t done = 0;
  if (n >= kLanes) {
    T acc[kLanes] = {};
    for (; done + kLanes <= n; done += kLanes) {
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) acc[j] += term(done + j);
    }
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < kLanes; ++j) total += acc[j];
  }
#pragma omp simd reduction(+ : total)
  for (int64_t i = done; i < n; ++i) total += term(i);
  return total;
}

// Per-plane partial results, in the caching allocator's memory: a few MiB for small
// H*W, which std::vector would page-fault in on every call.
inline double* scratch(Tensor& holder, int64_t count) {
  holder = empty({count}, TensorOptions(kFloat64));
  return holder.data_ptr<double>();
}

// y = x * scale[c] + shift[c] (+ r), then max(0, y) with kRelu, plane by plane: the
// normalisation and its epilogue (forward pass 2).
template <typename E, bool kResidual, bool kRelu, typename T = compute_t<E>>
void normalise_planes(const PlaneLayout& l, const E* x, const std::vector<T>& scale, const std::vector<T>& shift,
                      const E* r, E* y) {
  const int64_t S = l.s;
#pragma omp parallel for schedule(static) if (l.planes() * S > kBatchNormGrain && l.planes() > 1)
  for (int64_t p = 0; p < l.planes(); ++p) {
    const T a = scale[static_cast<size_t>(p % l.c)], b = shift[static_cast<size_t>(p % l.c)];
    const E* xp = x + p * S;
    E* yp = y + p * S;
    [[maybe_unused]] const E* rp = kResidual ? r + p * S : nullptr;
#pragma omp simd
    for (int64_t i = 0; i < S; ++i) {
      T v = widen(xp[i]) * a + b;
      if constexpr (kResidual) v += widen(rp[i]);
      if constexpr (kRelu) v = v > T(0) ? v : T(0);  // as UnaryOp::Relu
      narrow_into(yp[i], v);
    }
  }
}

template <typename E, typename T = compute_t<E>>
void scale_shift(const PlaneLayout& l, const E* x, const std::vector<T>& scale, const std::vector<T>& shift,
                 const E* residual, bool relu, E* y) {
  if (residual != nullptr) {
    return relu ? normalise_planes<E, true, true>(l, x, scale, shift, residual, y)
                : normalise_planes<E, true, false>(l, x, scale, shift, residual, y);
  }
  return relu ? normalise_planes<E, false, true>(l, x, scale, shift, residual, y)
              : normalise_planes<E, false, false>(l, x, scale, shift, residual, y);
}

// Per-channel (mean, biased centred sum of squares) of a training batch.
template <typename E, typename T = compute_t<E>>
void batch_moments(const PlaneLayout& l, const E* x, std::vector<double>& mean, std::vector<double>& squares) {
  const int64_t S = l.s;
  Tensor buffer;
  double* plane_sum = scratch(buffer, 3 * l.planes());
  double* plane_centre = plane_sum + l.planes();
  double* plane_squares = plane_centre + l.planes();
#pragma omp parallel for schedule(static) if (l.planes() * S > kBatchNormGrain && l.planes() > 1)
  for (int64_t p = 0; p < l.planes(); ++p) {
    const E* xp = x + p * S;
    const T sum = sum_run<T>(S, [xp](int64_t i) { return widen(xp[i]); });
    const T centre = sum / static_cast<T>(S);
    plane_sum[p] = static_cast<double>(sum);
    plane_centre[p] = static_cast<double>(centre);
    plane_squares[p] = static_cast<double>(sum_run<T>(S, [xp, centre](int64_t i) {
      const T d = widen(xp[i]) - centre;
      return d * d;
    }));
  }
  // Combine the planes per channel, visiting them in memory order.
  const double count = static_cast<double>(l.count()), s = static_cast<double>(S);
  std::fill(mean.begin(), mean.end(), 0.0);
  std::fill(squares.begin(), squares.end(), 0.0);
  for (int64_t p = 0; p < l.planes(); ++p) mean[p % l.c] += plane_sum[p];
  for (double& m : mean) m /= count;
  for (int64_t p = 0; p < l.planes(); ++p) {
    const double shift = plane_centre[p] - mean[p % l.c];
    squares[p % l.c] += plane_squares[p] + 2 * shift * (plane_sum[p] - s * plane_centre[p]) + s * shift * shift;
  }
}

template <typename E, typename T = compute_t<E>>
void batch_norm_forward_typed(const Tensor& in, const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                              Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                              bool relu, Tensor& out, Tensor& save_mean, Tensor& save_invstd) {
  const PlaneLayout l = layout_of(in);
  const bool rows = in.suggest_memory_format() == MemoryFormat::ChannelsLast;  // core/cpu/batch_norm_channels_last.h
  const channels_last::RowLayout rl{l.n * l.s, l.c};
  const auto C = static_cast<size_t>(l.c);
  std::vector<double> mean(C), invstd(C);
  if (training) {
    std::vector<double> squares(C);
    if (rows) channels_last::batch_moments<E>(rl, in.data_ptr<E>(), mean, squares);
    else batch_moments<E>(l, in.data_ptr<E>(), mean, squares);
    const double count = static_cast<double>(l.count());
    T* rm = running_mean.defined() ? running_mean.data_ptr<T>() : nullptr;
    T* rv = running_var.defined() ? running_var.data_ptr<T>() : nullptr;
    for (size_t c = 0; c < C; ++c) {
      invstd[c] = 1.0 / std::sqrt(squares[c] / count + eps);
      if (rm) rm[c] = static_cast<T>((1 - momentum) * static_cast<double>(rm[c]) + momentum * mean[c]);
      if (rv) rv[c] = static_cast<T>((1 - momentum) * static_cast<double>(rv[c]) + momentum * squares[c] / (count - 1));
    }
  } else {
    const T* rm = running_mean.data_ptr<T>();
    const T* rv = running_var.data_ptr<T>();
    for (size_t c = 0; c < C; ++c) {
      mean[c] = static_cast<double>(rm[c]);
      invstd[c] = 1.0 / std::sqrt(static_cast<double>(rv[c]) + eps);
    }
  }
  // y = (x - mean) * invstd * w + b, folded into one multiply-add per element.
  const std::vector<T> w = per_channel<T>(weight, l.c, T(1)), b = per_channel<T>(bias, l.c, T(0));
  std::vector<T> scale(C), shift(C);
  for (size_t c = 0; c < C; ++c) {
    if (save_mean.defined()) save_mean.data_ptr<T>()[c] = static_cast<T>(mean[c]);
    if (save_invstd.defined()) save_invstd.data_ptr<T>()[c] = static_cast<T>(invstd[c]);
    scale[c] = static_cast<T>(invstd[c]) * w[c];
    shift[c] = b[c] - static_cast<T>(mean[c]) * scale[c];
  }
  const E* r = residual.defined() ? residual.data_ptr<E>() : nullptr;
  if (rows) channels_last::scale_shift<E>(rl, in.data_ptr<E>(), scale, shift, r, relu, out.data_ptr<E>());
  else scale_shift<E>(l, in.data_ptr<E>(), scale, shift, r, relu, out.data_ptr<E>());
}

// Parameters, statistics and their gradients must have the compute type of the input's
// element type: float32 for 16-bit input (Note [Mixed-precision batch norm on the CPU]).
template <typename E>
void check_parameter_dtypes(const char* kernel, const Tensor& in, std::initializer_list<const Tensor*> params) {
  const DType want = dtype_of<compute_t<E>>();
  for (const Tensor* t : params) {
    LOOM_CHECK(!t->defined() || t->dtype() == want, kernel, ": a ", in.dtype(), " input needs ", want,
               " weight, bias, running and saved statistics on the CPU, got a per-channel tensor of dtype ",
               t->dtype(), (in.dtype() != want ? "; keep BatchNorm parameters in float32 (as autocast does)" : ""));
  }
}

void batch_norm_forward_cpu(const Tensor& in_any, const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                            Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                            bool relu, Tensor& out, Tensor& save_mean, Tensor& save_invstd) {
  // NCHW or channels-last: the input's format, which the output and residual share.
  const MemoryFormat format = in_any.suggest_memory_format();
  check_output_dense("batch_norm", out, format);
  LOOM_CHECK(training || (running_mean.defined() && running_var.defined()),
             "batch_norm kernel: eval mode needs running_mean and running_var");
  const Tensor in = contiguous_input(in_any, format);
  dispatch_floating_16bit(in.dtype(), "batch_norm", [&]<typename E>() {
    check_parameter_dtypes<E>("batch_norm", in, {&weight, &bias, &running_mean, &running_var, &save_mean, &save_invstd});
    batch_norm_forward_typed<E>(in, contiguous_input(weight), contiguous_input(bias), running_mean, running_var,
                                training, momentum, eps, contiguous_input(residual, format), relu, out, save_mean,
                                save_invstd);
  });
}

// The gradient reaching the normalisation, element i of a plane: dy, or with the fused
// ReLU dy where the output y > 0 and 0 elsewhere (ReLU's backward, as threshold_backward).
template <typename E, bool kRelu, typename T = compute_t<E>>
struct PlaneGrad {
  const E* dy;
  const E* y;  // with kRelu only
  T operator()(int64_t i) const {
    const T g = widen(dy[i]);  // loaded unconditionally: a load under ?: keeps bfloat16 loops scalar
    if constexpr (kRelu) return widen(y[i]) > T(0) ? g : T(0);
    return g;
  }
};

// Pass 1 of the backward: per-plane sum(g) and sum(g * (x - mean)). With `residual_grad`,
// g is first written there (the residual's gradient, Note [Fused BatchNorm epilogue]), and
// the sums read it back while the plane is still in cache.
template <typename E, bool kRelu, typename T = compute_t<E>>
void backward_sums(const PlaneLayout& l, const E* dy, const E* y, const E* x, const T* mean, E* residual_grad,
                   double* plane_dy, double* plane_dot, bool parallel) {
  const int64_t S = l.s;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < l.planes(); ++p) {
    const E* xp = x + p * S;
    const T m = mean[p % l.c];
    PlaneGrad<E, kRelu> g{dy + p * S, kRelu ? y + p * S : nullptr};
    if (residual_grad != nullptr) {
      E* gp = residual_grad + p * S;
#pragma omp simd
      for (int64_t i = 0; i < S; ++i) narrow_into(gp[i], g(i));  // exact: g is dy or 0
      plane_dy[p] = static_cast<double>(sum_run<T>(S, [gp](int64_t i) { return widen(gp[i]); }));
      plane_dot[p] =
          static_cast<double>(sum_run<T>(S, [gp, xp, m](int64_t i) { return widen(gp[i]) * (widen(xp[i]) - m); }));
    } else {
      plane_dy[p] = static_cast<double>(sum_run<T>(S, g));
      plane_dot[p] = static_cast<double>(sum_run<T>(S, [g, xp, m](int64_t i) { return g(i) * (widen(xp[i]) - m); }));
    }
  }
}

// Pass 2 of the backward: dx = a[c] * g + b[c] * x + c0[c].
template <typename E, bool kRelu, typename T = compute_t<E>>
void backward_dx(const PlaneLayout& l, const E* dy, const E* y, const E* x, const std::vector<T>& a,
                 const std::vector<T>& bx, const std::vector<T>& c0, E* dx, bool parallel) {
  const int64_t S = l.s;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < l.planes(); ++p) {
    const auto c = static_cast<size_t>(p % l.c);
    const T ap = a[c], bp = bx[c], cp = c0[c];
    const E* xp = x + p * S;
    PlaneGrad<E, kRelu> g{dy + p * S, kRelu ? y + p * S : nullptr};
    E* dxp = dx + p * S;
#pragma omp simd
    for (int64_t i = 0; i < S; ++i) narrow_into(dxp[i], ap * g(i) + bp * widen(xp[i]) + cp);
  }
}

template <typename E, typename T = compute_t<E>>
void batch_norm_backward_typed(const Tensor& grad_out, const Tensor& in, const Tensor& weight, const Tensor& save_mean,
                               const Tensor& save_invstd, bool training, const Tensor& relu_out, Tensor& grad_in,
                               Tensor& grad_weight, Tensor& grad_bias, Tensor& grad_residual) {
  const PlaneLayout l = layout_of(in);
  const auto C = static_cast<size_t>(l.c);
  const E* x = in.data_ptr<E>();
  const E* dy = grad_out.data_ptr<E>();
  const E* y = relu_out.defined() ? relu_out.data_ptr<E>() : nullptr;
  E* residual_grad = grad_residual.defined() ? grad_residual.data_ptr<E>() : nullptr;
  const T* mean = save_mean.data_ptr<T>();
  const T* invstd = save_invstd.data_ptr<T>();
  const std::vector<T> w = per_channel<T>(weight, l.c, T(1));
  const bool parallel = l.planes() * l.s > kBatchNormGrain && l.planes() > 1;
  const bool rows = in.suggest_memory_format() == MemoryFormat::ChannelsLast;  // core/cpu/batch_norm_channels_last.h
  const channels_last::RowLayout rl{l.n * l.s, l.c};

  // Pass 1: sum(g) and sum(g * (x - mean)) per channel. Eval-mode dx needs neither, but
  // the residual's gradient is written here.
  std::vector<double> sum_dy(C, 0.0), dot(C, 0.0);
  const bool sums = grad_weight.defined() || grad_bias.defined() || (grad_in.defined() && training) || residual_grad;
  if (sums && rows) {
    if (y) channels_last::backward_sums<E, true>(rl, dy, y, x, mean, residual_grad, sum_dy, dot);
    else channels_last::backward_sums<E, false>(rl, dy, y, x, mean, residual_grad, sum_dy, dot);
  } else if (sums) {
    Tensor buffer;
    double* plane_dy = scratch(buffer, 2 * l.planes());
    double* plane_dot = plane_dy + l.planes();
    if (y) backward_sums<E, true>(l, dy, y, x, mean, residual_grad, plane_dy, plane_dot, parallel);
    else backward_sums<E, false>(l, dy, y, x, mean, residual_grad, plane_dy, plane_dot, parallel);
    for (int64_t p = 0; p < l.planes(); ++p) {
      sum_dy[p % l.c] += plane_dy[p];
      dot[p % l.c] += plane_dot[p];
    }
  }
  for (size_t c = 0; c < C; ++c) {
    if (grad_weight.defined()) grad_weight.data_ptr<T>()[c] = static_cast<T>(dot[c] * static_cast<double>(invstd[c]));
    if (grad_bias.defined()) grad_bias.data_ptr<T>()[c] = static_cast<T>(sum_dy[c]);
  }
  if (!grad_in.defined()) return;

  // Pass 2. Training: dx = (g - mean(g) - (x - mean) * k) * invstd * w, where
  // k = dot * invstd^2 / count is the batch statistics' own dependence on x; folded
  // into dx = a*g + b*x + c0 per channel. Eval: the statistics are constants, so
  // dx = g * invstd * w.
  const double count = static_cast<double>(l.count());
  std::vector<T> a(C), bx(C), c0(C);
  for (size_t c = 0; c < C; ++c) {
    const double inv = static_cast<double>(invstd[c]);
    const double wi = inv * static_cast<double>(w[c]);
    const double k = training ? dot[c] * inv * inv / count : 0.0;
    const double mean_dy = training ? sum_dy[c] / count : 0.0;
    a[c] = static_cast<T>(wi);
    bx[c] = static_cast<T>(-k * wi);
    c0[c] = static_cast<T>((static_cast<double>(mean[c]) * k - mean_dy) * wi);
  }
  E* dx = grad_in.data_ptr<E>();
  if (rows) {
    if (residual_grad) channels_last::backward_dx<E, false>(rl, residual_grad, nullptr, x, a, bx, c0, dx);
    else if (y) channels_last::backward_dx<E, true>(rl, dy, y, x, a, bx, c0, dx);
    else channels_last::backward_dx<E, false>(rl, dy, nullptr, x, a, bx, c0, dx);
    return;
  }
  if (residual_grad) backward_dx<E, false>(l, residual_grad, nullptr, x, a, bx, c0, dx, parallel);  // g, as written
  else if (y) backward_dx<E, true>(l, dy, y, x, a, bx, c0, dx, parallel);
  else backward_dx<E, false>(l, dy, nullptr, x, a, bx, c0, dx, parallel);
}

void batch_norm_backward_cpu(const Tensor& grad_out_any, const Tensor& in_any, const Tensor& weight,
                             const Tensor& save_mean, const Tensor& save_invstd, bool training, const Tensor& relu_out,
                             Tensor& grad_in, Tensor& grad_weight, Tensor& grad_bias, Tensor& grad_residual) {
  // NCHW or channels-last: the input's format, which every activation-shaped tensor shares.
  const MemoryFormat format = in_any.suggest_memory_format();
  check_output_dense("batch_norm_backward", grad_in, format);
  check_output_dense("batch_norm_backward", grad_residual, format);
  const Tensor in = contiguous_input(in_any, format);
  const Tensor grad_out = contiguous_input(grad_out_any, format);
  dispatch_floating_16bit(in.dtype(), "batch_norm_backward", [&]<typename E>() {
    check_parameter_dtypes<E>("batch_norm_backward", in, {&weight, &save_mean, &save_invstd, &grad_weight, &grad_bias});
    batch_norm_backward_typed<E>(grad_out, in, contiguous_input(weight), contiguous_input(save_mean),
                                 contiguous_input(save_invstd), training, contiguous_input(relu_out, format), grad_in,
                                 grad_weight, grad_bias, grad_residual);
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(batch_norm_forward_kernel, DeviceType::CPU, batch_norm_forward_cpu);
LOOM_REGISTER_KERNEL(batch_norm_backward_kernel, DeviceType::CPU, batch_norm_backward_cpu);

}  // namespace loom::cpu
