// CUDA dropout: mask = bernoulli(1 - p) / (1 - p), out = in * mask -- the GPU twin of
// core/cpu/dropout.cpp, drawing the *same* mask.
//
// Element i keeps its value when random_uniform(seed, first + i) < 1 - p, with `first`
// the generator's reserved counter (Note [Counter-based randomness]) and random_uniform
// the device copy of core/generator.h's (cuda/random_bits.cuh, Note [Same numbers on
// every device]): integer arithmetic and one exact conversion to double, so the kept
// units are bit for bit those of the CPU for the same generator state, and a seeded
// run drops the same units on either device. The scale 1 / (1 - p) is computed on the
// host, as on the CPU, and out = in * mask is a single rounded multiply: float32 and
// float64 outputs equal the CPU's exactly. 16-bit floats multiply in float.
#include "core/kernels.h"
#include "cuda/kernel_utils.cuh"  // defines: dense, check_dense_output
#include "cuda/loops.cuh"         // defines: dispatch_types, widen, narrow, grid_size
#include "cuda/random_bits.cuh"   // defines: random_uniform (device copy)

namespace loom::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    dropout_cuda_kernel(const T* x, T* y, T* mask, int64_t n, uint64_t seed, uint64_t first, double keep,
                        compute_t<T> scale) {
  using Acc = compute_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Acc m = random_uniform(seed, first + static_cast<uint64_t>(i)) < keep ? scale : Acc(0);
    mask[i] = narrow<T>(m);
    y[i] = narrow<T>(widen(x[i]) * m);
  }
}

void dropout_cuda(const Tensor& in_any, double p, Generator& gen, Tensor& out, Tensor& mask) {
  check_dense_output("dropout", out);
  check_dense_output("dropout", mask);
  LOOM_CHECK(p >= 0 && p < 1, "dropout kernel: expected p in [0, 1), got ", p);
  const Tensor in = dense(in_any);
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "dropout", [&]<typename T>() {
    const int64_t n = in.numel();
    // Reserve even for n == 0, as the CPU does, so both devices' generators stay in step.
    const uint64_t seed = gen.seed();
    const uint64_t first = gen.reserve(static_cast<uint64_t>(n));
    if (n == 0) return;
    const double keep = 1.0 - p;
    using Acc = compute_t<T>;
    const Acc scale = static_cast<Acc>(1.0 / keep);
    const int device = out.device().index;
    DeviceGuard guard(device);
    dropout_cuda_kernel<T><<<grid_size(n, device), kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()), static_cast<T*>(mask.raw_data()), n,
        seed, first, keep, scale);
    LOOM_CUDA_CHECK_LAUNCH("dropout");
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(dropout_kernel, DeviceType::CUDA, dropout_cuda);

}  // namespace loom::cuda
