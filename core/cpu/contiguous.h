// contiguous_input: the dense layout the CPU neural-network kernels index directly.
//
// The backend interface (core/kernels.h) lets inputs be arbitrary strided views. The
// pooling, batch-norm and softmax/loss kernels walk planes and rows with plain pointer
// arithmetic, so a strided input is first copied into a dense buffer; a contiguous one
// (what the autograd ops pass) is used as is, at no cost.
#pragma once

#include "core/copy.h"
#include "core/error.h"
#include "core/tensor.h"

namespace loom::cpu {

inline Tensor contiguous_input(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  Tensor dense = empty(t.shape(), TensorOptions(t.dtype()).device(t.device()));
  copy_into(dense, t);
  return dense;
}

// Outputs are allocated by the caller (core/kernels.h), always with empty(): dense.
inline void check_output_dense(const char* kernel, const Tensor& out) {
  LOOM_CHECK(!out.defined() || out.is_contiguous(), kernel, ": expected a contiguous output tensor, got strides ",
             out.strides(), " for shape ", out.shape());
}

}  // namespace loom::cpu
