// Which precision a convolution runs in under CPU autocast, by measurement.
//
// Note [Autocast precision by measurement]
// Autocast trades precision for speed: conv2d's inputs go to 16 bits because 16-bit
// kernels are supposed to be faster. On a CPU that is not a given. bfloat16 halves the
// bytes, but oneDNN's bfloat16 convolutions are direct ones, while loom's float32
// 3x3 convolutions are Winograd (2.25x fewer multiplications); and every bfloat16 layer
// pays casts (the float32 input of the first layer, each weight once per step, the
// input gradient back to a float32 source). On one Intel Xeon oneDNN 2.6's bfloat16
// convolutions ran at 0.43x float32; on an AMD EPYC the airbench94 network ran at 0.94x
// float32 in bfloat16 although each pass's kernel had been chosen by the per-pass search
// (Note [Conv2d autotuning], which kept four passes in float32): the casts around a
// layer were not counted.
//
// So with loom::backends::cpu::benchmark on, the first time autocast meets a
// convolution key (shapes, strides, layout, the input's dtype, which gradients the
// graph needs, threads) it times the layer both ways on the call's own tensors, each
// with the casts it implies:
//   16-bit:  input to 16 bits (if it is float32), weight and bias to 16 bits, forward;
//            in training both backward passes (float32 weight gradients, Note [Autocast
//            conv2d weight gradients]) and the input gradient back to float32;
//   float32: input to float32 (if a 16-bit layer made it), forward, the output to 16
//            bits; the output gradient back to float32, both backward passes, the
//            input gradient back to 16 bits.
// and keeps the faster for the key, as autotune::choose does for kernels: in the
// choice table, the cache file and the ranks' agreement with it (Note [Kernel
// autotuning], core/cpu/kernel_benchmark.h). A layer that keeps float32 is named once
// on stderr. Its output is 16-bit either way, as PyTorch's autocast promises for every
// op on its lower-precision list: the ops after it see the dtype they would have seen
// (a residual add of a 16-bit shortcut and a float32 convolution output would be an
// error). Whole networks are measured too (bench/conv_benchmark.py's bf16 rows): the
// layer-by-layer choice does not see what its casts cost the ops around it.
//
// The choice is precision's, not only speed's: a layer kept in float32 computes more
// exactly than autocast asked, never less. Off (benchmark off, the default outside
// loom's trainer and benches), autocast casts every convolution as PyTorch's does.
#pragma once

#include "core/kernels.h"  // defines: Conv2dParams
#include "core/shape.h"
#include "core/tensor.h"

namespace loom::ops {

// True when conv2d(input, weight, bias) under the current CPU autocast scope should run
// in float32 instead of autocast's 16-bit dtype: benchmark is on, the weight (and bias)
// are float32, and the measurement above found float32 faster. False (cast as usual)
// everywhere else: autocast off on the CPU, benchmark off, 16-bit parameters, CUDA.
bool autocast_conv2d_keeps_float32(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                   const Conv2dParams& params, const Shape& out_shape);

}  // namespace loom::ops
