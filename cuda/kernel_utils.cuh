// Helpers shared by the neural-network kernels of cuda/ (index, pooling, batch norm,
// softmax/loss, dropout, SGD): a block-wide sum, the "bad index" word through which a
// kernel reports an out-of-range index, and small layout checks. Internal to cuda/.
//
// Note [Index validation on the GPU]
// The CPU kernels check every index before touching memory and throw a loom::Error
// naming it. A GPU kernel cannot throw, and checking on the host would mean copying the
// index tensor back. So the kernel itself checks: an out-of-range index is *skipped*
// (never a read or write out of bounds) and the first one met is recorded in a two-word
// device flag {seen, value}; the host reads the flag back after the launch and throws
// the same message as the CPU. Reading it back waits for the kernel: a stream
// synchronisation per call, which the index ops (not on a training step's path) and
// nll_loss's forward (once per step, just before the loss is read anyway) can afford.
// The backward kernels get indices their forward already validated, and only skip.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/factory.h"  // defines: empty
#include "core/tensor.h"
#include "cuda/check.h"   // defines: LOOM_CUDA_CHECK
#include "cuda/copy.h"    // defines: contiguous_on_device
#include "cuda/device.h"  // defines: current_stream
#include "cuda/loops.cuh"  // defines: kBlockSize

namespace loom::cuda {

// Sum of one value per thread, returned to every thread of the block. blockDim.x must be
// kBlockSize. May be called repeatedly by the same block (it synchronises before reuse).
template <typename Acc>
__device__ inline Acc block_sum(Acc value) {
  __shared__ Acc warp_sums[kBlockSize / 32];
  __shared__ Acc total;
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : Acc(0);
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
    if (lane == 0) total = value;
  }
  __syncthreads();
  const Acc result = total;
  __syncthreads();  // `total` and `warp_sums` are reused by the next call
  return result;
}

// Records the first out-of-range index a kernel meets: see Note [Index validation on the GPU].
__device__ inline void report_bad_index(int64_t* flag, int64_t value) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(flag), 0ull, 1ull) == 0ull) flag[1] = value;
}

// The device flag of Note [Index validation on the GPU]: zeroed on the device's stream.
struct BadIndexFlag {
  Tensor words;
  int64_t* ptr = nullptr;

  explicit BadIndexFlag(int device) {
    words = empty({2}, TensorOptions(kInt64).device(Device(DeviceType::CUDA, device)));
    ptr = words.data_ptr<int64_t>();
    LOOM_CUDA_CHECK(cudaMemsetAsync(ptr, 0, 2 * sizeof(int64_t), current_stream(device).handle),
                    "zeroing the bad-index flag on cuda:", device);
  }

  // Waits for the kernels queued so far; {false, 0} when every index was in range.
  std::pair<bool, int64_t> read(int device) const {
    int64_t host[2] = {0, 0};
    const Stream stream = current_stream(device);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(host, ptr, sizeof host, cudaMemcpyDeviceToHost, stream.handle),
                    "reading the bad-index flag back from cuda:", device);
    stream.synchronize();
    return {host[0] != 0, host[1]};
  }
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A pointer to an optional tensor's elements (nullptr when undefined), contiguous.
template <typename T>
const T* optional_data(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}

// Outputs come from empty() (core/kernels.h), so they are dense; say so if not.
inline void check_dense_output(const char* kernel, const Tensor& out) {
  LOOM_CHECK(!out.defined() || out.is_contiguous(), kernel, " on CUDA: expected a contiguous output tensor, got strides ",
             out.strides(), " for shape ", out.shape());
}

// `t` itself if undefined or contiguous, else a dense copy on its device.
inline Tensor dense(const Tensor& t) { return t.defined() ? contiguous_on_device(t) : t; }

}  // namespace loom::cuda
