// The fused SGD update (nn/optim/sgd.h: sgd_update_kernel) on CUDA: one pass over
// param, grad and momentum buffer per parameter, with PyTorch's exact rule (Note [SGD
// update rule] in nn/optim/sgd.h) -- weight decay, momentum with dampening (undampened
// on the first step), Nesterov, maximize.
//
// Every step of the rule is one rounded operation in the parameter's dtype, in the
// CPU kernel's order; mul/add below are __fmul_rn / __fadd_rn (and the double ones),
// which nvcc may not fuse into multiply-adds. So a float32 or float64 update is bit for
// bit the CPU's (nn/optim/sgd.cpp is compiled without contraction either: Note [No
// fused multiply-adds where the GPU must agree] in meson.build), and a model trained on
// the GPU follows the CPU's parameters as closely as its gradients agree. 16-bit
// parameters update in float and round once.
//
// The kernel is registered from cuda/ although its stub lives in nn/: the backend fills
// every dispatch slot of the program, whichever layer declared it.
#include "cuda/kernel_utils.cuh"  // defines: check_dense_output
#include "cuda/loops.cuh"         // defines: dispatch_types, widen, narrow, grid_size
#include "nn/optim/sgd.h"         // declares: sgd_update_kernel, SGDStep

namespace loom::cuda {
namespace {

__device__ inline float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float add(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ inline double add(double a, double b) { return __dadd_rn(a, b); }

// The rule's constants in the arithmetic type, converted on the host as the CPU does.
template <typename Acc>
struct SgdConstants {
  Acc lr, wd, mom, keep;  // keep = 1 - dampening
  bool decay, momentum, nesterov, maximize, first_step;
};

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    sgd_update(T* p, const T* g, T* buf, int64_t n, SgdConstants<compute_t<T>> s) {
  using Acc = compute_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Acc pi = widen(p[i]);
    Acc d = s.maximize ? -widen(g[i]) : widen(g[i]);
    if (s.decay) d = add(d, mul(s.wd, pi));
    if (s.momentum) {
      const Acc b = s.first_step ? d : add(mul(s.mom, widen(buf[i])), mul(s.keep, d));
      buf[i] = narrow<T>(b);
      d = s.nesterov ? add(d, mul(s.mom, b)) : b;
    }
    p[i] = narrow<T>(add(pi, -mul(s.lr, d)));  // p - lr * d, one rounding each
  }
}

void sgd_update_cuda(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const optim::SGDStep& step) {
  check_dense_output("SGD step", param);
  check_dense_output("SGD step", momentum_buffer);
  LOOM_CHECK(grad.is_contiguous() && grad.numel() == param.numel() && grad.dtype() == param.dtype(),
             "SGD step on CUDA: expected a contiguous gradient like the parameter ", param.str(), ", got ", grad.str());
  LOOM_CHECK(step.momentum == 0 || momentum_buffer.defined(),
             "SGD step on CUDA: momentum ", step.momentum, " needs a momentum buffer");
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_types(FloatAndHalfTypes{}, param.dtype(), "SGD step", [&]<typename T>() {
    using Acc = compute_t<T>;
    const SgdConstants<Acc> s{static_cast<Acc>(step.lr), static_cast<Acc>(step.weight_decay),
                              static_cast<Acc>(step.momentum), static_cast<Acc>(1.0 - step.dampening),
                              step.weight_decay != 0, step.momentum != 0, step.nesterov, step.maximize,
                              step.first_step};
    const int device = param.device().index;
    DeviceGuard guard(device);
    sgd_update<T><<<grid_size(n, device), kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()),
        momentum_buffer.defined() ? static_cast<T*>(momentum_buffer.raw_data()) : nullptr, n, s);
    LOOM_CUDA_CHECK_LAUNCH("SGD step");
  });
}

}  // namespace

using optim::sgd_update_kernel;  // (the registrar's name is pasted from the kernel's)
LOOM_REGISTER_KERNEL(sgd_update_kernel, DeviceType::CUDA, sgd_update_cuda);

}  // namespace loom::cuda
