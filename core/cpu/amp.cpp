// The CPU kernel of mixed-precision training: GradScaler's unscale with the inf/NaN
// check in one pass over each gradient (core/kernels.h, non_finite_check_and_unscale).
#include <cmath>
#include <type_traits>

#include "core/kernels.h"

namespace loom {
namespace {

template <typename T>
bool unscale_loop(T* g, int64_t n, double inv_scale) {
  using Wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Wide s = static_cast<Wide>(inv_scale);
  bool non_finite = false;
  // One pass: the multiply also runs on the elements after an inf (PyTorch does the
  // same); the step is skipped anyway, and a branch would stop vectorisation.
#pragma omp parallel for reduction(|| : non_finite) schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const Wide v = static_cast<Wide>(g[i]);
    non_finite = non_finite || !std::isfinite(v);
    g[i] = static_cast<T>(v * s);
  }
  return non_finite;
}

void non_finite_check_and_unscale_cpu(Tensor& grad, Tensor& found_inf, double inv_scale) {
  check_unscale_arguments(grad, found_inf);
  bool non_finite = false;
  switch (grad.dtype()) {
    case kFloat32: non_finite = unscale_loop(grad.data_ptr<float>(), grad.numel(), inv_scale); break;
    case kFloat64: non_finite = unscale_loop(grad.data_ptr<double>(), grad.numel(), inv_scale); break;
    case kFloat16: non_finite = unscale_loop(grad.data_ptr<Half>(), grad.numel(), inv_scale); break;
    case kBFloat16: non_finite = unscale_loop(grad.data_ptr<BFloat16>(), grad.numel(), inv_scale); break;
    default:
      LOOM_FAIL("non_finite_check_and_unscale: expected a floating-point gradient, got ", grad.dtype());
  }
  if (non_finite) *found_inf.data_ptr<float>() = 1.0f;
}

}  // namespace

LOOM_REGISTER_KERNEL(non_finite_check_and_unscale_kernel, DeviceType::CPU, non_finite_check_and_unscale_cpu);

}  // namespace loom
