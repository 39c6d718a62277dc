// Numeric settings of the CUDA libraries, as torch.backends.cuda.matmul.allow_tf32 and
// torch.backends.cudnn.allow_tf32. Public header (no CUDA includes).
//
// TF32 runs float32 products on tensor cores with a 10-bit mantissa: ~8x the FP32
// throughput on A100/H100, results that differ from FP32 at ~1e-3 relative. The
// defaults are PyTorch's: off for matmuls (float32 means float32 unless asked), on for
// convolutions (where training is insensitive to it and the speedup is largest).
#pragma once

namespace loom::cuda {

// mm / bmm (cuda/cublas.cpp). Default false.
void set_allow_tf32(bool allow);
bool allow_tf32();

// conv2d (cuda/cudnn_conv.cpp). Default true.
void set_cudnn_allow_tf32(bool allow);
bool cudnn_allow_tf32();

}  // namespace loom::cuda
