// The memory format in which CPU activations let every convolution run without a
// reorder: what `train_cifar10 --memory-format auto` and bench_train feed the model.
//
//   Tensor images = batch.contiguous(cpu::activation_format(kFloat32));
//
// Note [Channels-last on AVX2]
// A convolution on the CPU is a oneDNN primitive or loom's own Winograd, and each takes
// some activation layouts as they are and reorders the rest (Note [Conv2d memory
// layout], core/cpu/conv2d.cpp). Which layout needs no reorder at all depends on the CPU:
//   bfloat16 (oneDNN)    channels-last: its bf16 kernels compute in NHWC.
//   float32, AVX-512     NCHW: oneDNN's Winograd and direct kernels compute in the
//                        blocked nChw16c whatever loom hands them, so every layout is
//                        reordered alike, and the rest of loom is tuned on NCHW.
//   float32, AVX2 only   channels-last: loom's Winograd (the stride-1 3x3 convolutions)
//                        reads and writes NHWC as it is (Note [Winograd in channels-last]),
//                        and oneDNN's jit:avx2 direct kernels (the stem, the stride-2 3x3
//                        convolutions, the 1x1 shortcuts) take NHWC in all three passes.
//                        Batch norm, ReLU, the residual additions and the pooling keep the
//                        format (Note [Channels-last activations], core/memory_format.h),
//                        so a ResNet's activations stay NHWC from its stem to its pooling.
//                        In NCHW the oneDNN convolutions reorder to and from nChw8c around
//                        each call instead: ResNet18-CIFAR at batch 32 did 52 reorders a
//                        step (ONEDNN_VERBOSE=1), 32 of them activations; in channels-last
//                        a step reorders only its 20 oneDNN-convolution weights (OIHW to
//                        the kernels' blocked layout and back, ~0.04 ms each).
//                        Where NHWC is slower: oneDNN's jit:avx2 kernels on nhwc run about
//                        7% behind their nChw8c versions (most in the stride-2 3x3
//                        convolutions' backward passes: 64->128 at 32x32, input gradient
//                        15.1 against 12.6 ms, one thread, batch 32; the stem's weight
//                        gradient 2.4 against 1.3 ms), which about cancels the activation
//                        reorders they save (146 against 148 ms a step, all oneDNN
//                        convolutions and reorders together). The gain is loom's Winograd,
//                        whose NHWC passes are the faster (Note [Winograd in channels-last]).
// Under LOOM_CPU_ISA=avx2 (Note [CPU ISA switch], core/cpu/cpu_isa.h) an AVX-512 machine
// takes the AVX2 row.
#pragma once

#include "core/dtype.h"          // defines: DType
#include "core/memory_format.h"  // defines: MemoryFormat

namespace loom::cpu {

// See Note [Channels-last on AVX2]: ChannelsLast for bfloat16, and for float32 where
// oneDNN has no AVX-512; Contiguous otherwise.
MemoryFormat activation_format(DType dtype);

}  // namespace loom::cpu
