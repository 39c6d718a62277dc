// cuBLAS settings, as torch.backends.cuda.matmul.allow_tf32. Public header (no CUDA
// includes); the matmul kernels themselves are in cuda/cublas.cpp.
#pragma once

namespace loom::cuda {

// TF32 tensor cores for float32 matmuls: ~8x the FP32 throughput on A100/H100, with a
// 10-bit mantissa for the products (results differ from FP32 at ~1e-3 relative).
// Default off, as PyTorch >= 1.12: float32 means float32 unless asked.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace loom::cuda
