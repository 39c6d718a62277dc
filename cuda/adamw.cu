// The fused AdamW update (core/kernels.h: adamw_update_kernel) on CUDA: one pass over the
// parameter, its gradient and its moments, with the CPU loop's rule and order of
// operations (nn/optim/adamw.cpp, Note [AdamW update rule] in nn/optim/adamw.h):
//
//   g = -grad if maximize;  p = p * (1 - lr * wd)
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   v_hat = max(v_max, v) with amsgrad (kept in v_max), else v
//   p = p - step_size * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
//
// The constants are computed once on the host in double and converted to the parameter's
// type, as the CPU does. Unlike the SGD update (cuda/sgd.cu) this is not bit for bit the
// CPU's: the CPU loop is compiled with fused multiply-adds and CUDA's sqrt and division
// round differently from g++'s vectorised ones, so a float32 step agrees to a few ulps.
// float32 and float64 as on the CPU; 16-bit parameters (and moments) update in float and
// round once per stored value.
#include "core/kernels.h"
#include "cuda/kernel_utils.cuh"  // defines: check_dense_output
#include "cuda/loops.cuh"         // defines: dispatch_types, widen, narrow, grid_size

namespace loom::cuda {
namespace {

template <typename Acc>
struct AdamWConstants {
  Acc decay, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, bias_correction2_sqrt, eps;
  bool maximize;
};

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    adamw_update(T* p, const T* g, T* m, T* v, T* v_max, int64_t n, AdamWConstants<compute_t<T>> s) {
  using Acc = compute_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Acc grad = s.maximize ? -widen(g[i]) : widen(g[i]);
    const Acc decayed = widen(p[i]) * s.decay;
    const Acc mi = s.beta1 * widen(m[i]) + s.one_minus_beta1 * grad;
    const Acc vi = s.beta2 * widen(v[i]) + s.one_minus_beta2 * grad * grad;
    m[i] = narrow<T>(mi);
    v[i] = narrow<T>(vi);
    Acc second = vi;
    if (v_max) {
      const Acc previous = widen(v_max[i]);
      second = previous > vi ? previous : vi;
      v_max[i] = narrow<T>(second);
    }
    const Acc denom = sqrt(second) / s.bias_correction2_sqrt + s.eps;
    p[i] = narrow<T>(decayed - s.step_size * (mi / denom));
  }
}

void check_like_param(const Tensor& param, const Tensor& t, const char* what) {
  LOOM_CHECK(t.is_contiguous() && t.numel() == param.numel() && t.dtype() == param.dtype() &&
                 t.device() == param.device(),
             "AdamW step on CUDA: expected ", what, " contiguous and like the parameter ", param.str(), ", got ",
             t.str());
}

void adamw_update_cuda(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                       Tensor& max_exp_avg_sq, const AdamWStep& step) {
  check_dense_output("AdamW step", param);
  check_like_param(param, grad, "the gradient");
  check_like_param(param, exp_avg, "exp_avg");
  check_like_param(param, exp_avg_sq, "exp_avg_sq");
  if (max_exp_avg_sq.defined()) check_like_param(param, max_exp_avg_sq, "max_exp_avg_sq");
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_types(FloatAndHalfTypes{}, param.dtype(), "AdamW step", [&]<typename T>() {
    using Acc = compute_t<T>;
    // Each constant converted from double as the CPU loop converts it.
    const AdamWConstants<Acc> s{static_cast<Acc>(step.decay_factor),
                                static_cast<Acc>(step.beta1),
                                static_cast<Acc>(step.beta2),
                                static_cast<Acc>(1 - step.beta1),
                                static_cast<Acc>(1 - step.beta2),
                                static_cast<Acc>(step.step_size),
                                static_cast<Acc>(step.bias_correction2_sqrt),
                                static_cast<Acc>(step.eps),
                                step.maximize};
    const int device = param.device().index;
    DeviceGuard guard(device);
    adamw_update<T><<<grid_size(n, device), kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()),
        static_cast<T*>(exp_avg.raw_data()), static_cast<T*>(exp_avg_sq.raw_data()),
        max_exp_avg_sq.defined() ? static_cast<T*>(max_exp_avg_sq.raw_data()) : nullptr, n, s);
    LOOM_CUDA_CHECK_LAUNCH("AdamW step");
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(adamw_update_kernel, DeviceType::CUDA, adamw_update_cuda);

}  // namespace loom::cuda
