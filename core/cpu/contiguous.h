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

// `format`: kernels that also compute on channels-last activations (batch norm) ask for
// the input's own format (Note [Channels-last activations], core/memory_format.h).
inline Tensor contiguous_input(const Tensor& t, MemoryFormat format = MemoryFormat::Contiguous) {
  if (!t.defined() || t.is_contiguous(format)) return t;
  Tensor dense = empty(t.shape(), TensorOptions(t.dtype()).device(t.device()), format);
  copy_into(dense, t);
  return dense;
}

// Outputs are allocated by the caller (core/kernels.h), dense in the format the kernel
// computes in.
inline void check_output_dense(const char* kernel, const Tensor& out, MemoryFormat format = MemoryFormat::Contiguous) {
  LOOM_CHECK(!out.defined() || out.is_contiguous(format), kernel, ": expected a dense ", format,
             " output tensor, got strides ", out.strides(), " for shape ", out.shape());
}

}  // namespace loom::cpu
