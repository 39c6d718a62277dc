// What the CPU and CUDA pooling kernels (core/cpu/pooling.cpp, cuda/pooling.cu) both need
// to walk a [N, C, H, W] or [C, H, W] tensor window by window: the planes and their
// sizes, and the first in-bounds tap of a window that starts in the padding.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom {

// `count` planes of in_h x in_w pooled to out_h x out_w (every leading dim is a plane).
struct PoolPlanes {
  int64_t count, in_h, in_w, out_h, out_w;
};

inline PoolPlanes pool_planes_of(const Tensor& in, const Tensor& out) {
  const int64_t d = in.dim();
  LOOM_CHECK(d >= 3 && out.dim() == d, "pooling kernel: expected [N, C, H, W] or [C, H, W] tensors, got input ",
             in.shape(), " and output ", out.shape());
  PoolPlanes p{1, in.size(d - 2), in.size(d - 1), out.size(d - 2), out.size(d - 1)};
  for (int64_t i = 0; i < d - 2; ++i) p.count *= in.size(i);
  return p;
}

// The first index >= 0 of the sequence start, start + step, ... (start may be negative:
// a window that begins in the padding).
LOOM_HOST_DEVICE inline int64_t first_inside(int64_t start, int64_t step) {
  return start >= 0 ? start : start + ((-start + step - 1) / step) * step;
}

}  // namespace loom
