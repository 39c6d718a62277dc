// 16-bit operands on the CPU backend, run through the float32 kernels.
//
// Note [16-bit CPU kernels stage through float32]
// The CPU backend has no 16-bit elementwise arithmetic (core/dtype.h: Half and BFloat16
// only carry bits). The unary/binary elementwise kernels (the engine adds gradients with
// the latter), the reductions (sum/mean/max/min, argmax), and every float16 mm, bmm and
// conv2d copy their operands to float32,
// run the float32 kernel -- float32 accumulation, as cuBLAS and cuDNN do for 16-bit
// inputs -- and round each result to 16 bits once. Two extra passes over the data, so
// slower than float32 itself; the point is that autocast (autograd/autocast.h) runs on
// the CPU with the same dtypes and results to 16-bit rounding as on CUDA, and its policy
// is tested here. bfloat16 conv2d (forward and both gradients), mm and bmm -- the heavy
// kernels -- are native instead, on oneDNN's bf16 primitives wherever oneDNN has them
// (Note [bfloat16 on the CPU], core/cpu/bf16_path.h); they stage only on CPUs without
// AVX-512, or under LOOM_CPU_BF16=staging.
#pragma once

#include "core/factory.h"
#include "core/kernels.h"

namespace loom::cpu {

inline bool is_16bit_float(DType dtype) { return dtype == kFloat16 || dtype == kBFloat16; }

// A contiguous float32 copy of `t`; undefined stays undefined.
inline Tensor float32_copy(const Tensor& t) {
  if (!t.defined()) return Tensor();
  Tensor out = empty(t.shape(), TensorOptions(kFloat32).device(t.device()));
  copy_kernel(DeviceType::CPU)(t, out, /*non_blocking=*/false);
  return out;
}

// An uninitialised float32 tensor shaped like `t`; undefined stays undefined.
inline Tensor float32_like(const Tensor& t) {
  if (!t.defined()) return Tensor();
  return empty(t.shape(), TensorOptions(kFloat32).device(t.device()));
}

// Rounds a float32 result into the 16-bit output `out` (any strides).
inline void round_into(const Tensor& result, Tensor& out) {
  if (out.defined()) copy_kernel(DeviceType::CPU)(result, out, /*non_blocking=*/false);
}

}  // namespace loom::cpu
