// 16-bit operands on the CPU backend, run through the float32 kernels.
//
// Note [16-bit CPU kernels stage through float32]
// What stages: the reductions (sum/mean/max/min, argmax) on 16-bit floats, and every
// float16 mm, bmm and conv2d (and bfloat16 ones on CPUs without AVX-512, or under
// LOOM_CPU_BF16=staging). They copy their operands to float32, run the float32 kernel --
// float32 accumulation, as cuBLAS and cuDNN do for 16-bit inputs -- and round each result
// to 16 bits once: two extra passes over the data, slower than float32 itself, but
// autocast (autograd/autocast.h) runs on the CPU with the same dtypes and results to
// 16-bit rounding as on CUDA, and its policy is tested here.
//
// What is native (a ResNet step under --amp bf16 stages nothing on the hot path):
// - bfloat16 conv2d (forward and both gradients), mm and bmm, on oneDNN's bf16
//   primitives (Note [bfloat16 on the CPU], core/cpu/bf16_path.h);
// - on 16-bit floats of both kinds (Note [bfloat16 conversion in registers],
//   core/cpu/bf16_convert.h): the unary/binary elementwise kernels and threshold_backward
//   (so relu, add and the engine's gradient additions), dtype copies (autocast's casts),
//   batch norm with its fused epilogue (16-bit activations with float32 parameters:
//   Note [Mixed-precision batch norm on the CPU]), max/avg/adaptive-avg pooling forward
//   and backward, and dropout. Each reads and writes 16 bits in one pass and computes in
//   float, with vectorised conversions for bfloat16 (float16's are scalar).
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
