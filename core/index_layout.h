// What the CPU and CUDA index kernels (core/cpu/index.cpp, cuda/index.cu) share: the
// strided views that turn gather/scatter/index_select/index_add into one loop over the
// index's positions (Note [Index kernels as one loop] in core/cpu/index.cpp), and their
// errors, word for word the same on both devices.
#pragma once

#include <cstdint>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"

namespace loom {

// `strides` with the `dim` entry zeroed: base(p) of Note [Index kernels as one loop].
inline Shape without_dim(Shape strides, int64_t dim) {
  strides[dim] = 0;
  return strides;
}

// A 1-D (or 0-dim) index viewed with `shape`, varying only along `dim`.
inline Tensor along_dim(const Tensor& index, int64_t dim, const Shape& shape) {
  Shape strides(shape.size(), 0);
  strides[dim] = index.dim() == 0 ? 0 : index.stride(0);
  return make_tensor(index.storage(), shape, std::move(strides), index.storage_offset(), index.dtype());
}

inline void check_index_dtype(const char* op, const Tensor& index) {
  LOOM_CHECK(index.dtype() == kInt64, op, ": expected an int64 index tensor, got ", index.dtype());
}

// `bad` says whether some index fell outside [0, size); `value` is one that did.
inline void check_index_in_bounds(const char* op, bool bad, int64_t value, int64_t dim, int64_t size) {
  LOOM_CHECK(!bad, op, ": index ", value, " is out of bounds for dimension ", dim, " with size ", size,
             " (valid indices are 0..", size - 1, ")");
}

}  // namespace loom
