// The CUDA kernel of mixed-precision training: GradScaler's unscale with the inf/NaN
// check in one pass over each gradient (core/kernels.h, non_finite_check_and_unscale;
// the CPU twin is core/cpu/amp.cpp).
//
// found_inf stays on the device: the kernel writes 1.0f there when it meets a non-finite
// value (a plain store; every writer stores the same value, so no atomic is needed),
// and GradScaler reads it once per step, after all gradients are checked.
#include <cmath>

#include "core/kernels.h"
#include "cuda/loops.cuh"  // defines: dispatch_types, widen, narrow, grid_size, kBlockSize

namespace loom::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    non_finite_check_and_unscale(T* grad, int64_t n, float* found_inf, compute_t<T> inv_scale) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool non_finite = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const compute_t<T> v = widen(grad[i]);
    non_finite |= !isfinite(v);
    grad[i] = narrow<T>(v * inv_scale);
  }
  if (non_finite) *found_inf = 1.0f;
}

void non_finite_check_and_unscale_cuda(Tensor& grad, Tensor& found_inf, double inv_scale) {
  check_unscale_arguments(grad, found_inf);
  const int64_t n = grad.numel();
  if (n == 0) return;
  const int device = grad.device().index;
  DeviceGuard guard(device);
  dispatch_types(FloatAndHalfTypes{}, grad.dtype(), "non_finite_check_and_unscale", [&]<typename T>() {
    non_finite_check_and_unscale<T><<<grid_size(n, device), kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<T*>(grad.raw_data()), n, static_cast<float*>(found_inf.raw_data()),
        static_cast<compute_t<T>>(inv_scale));
    LOOM_CUDA_CHECK_LAUNCH("non_finite_check_and_unscale");
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(non_finite_check_and_unscale_kernel, DeviceType::CUDA, non_finite_check_and_unscale_cuda);

}  // namespace loom::cuda
