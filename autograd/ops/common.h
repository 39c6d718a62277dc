// Checks shared by the differentiable ops: the error messages users see most.
#pragma once

#include "autograd/grad_mode.h"
#include "autograd/saved_tensor.h"
#include "autograd/variable.h"
#include "core/error.h"
#include "core/tensor.h"

namespace loom::ops {

// The memory format an activation op computes in and gives its outputs (Note
// [Channels-last activations], core/memory_format.h): the input's on the CPU, whose conv2d
// and batch-norm kernels compute on channels-last data; NCHW on CUDA, whose kernels read
// NCHW (a channels-last input is converted first).
inline MemoryFormat activation_format(const Tensor& input) {
  return input.device().is_cpu() ? input.suggest_memory_format() : MemoryFormat::Contiguous;
}

inline void check_defined(const char* op, const Tensor& t, const char* what) {
  LOOM_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// Operands of one op must live on the same device and have the same dtype.
inline void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "the first operand");
  check_defined(op, b, "the second operand");
  LOOM_CHECK(a.device() == b.device(), op, ": expected both tensors on the same device, got ", a.device(), " and ",
             b.device(), "; move one with .to(device)");
  LOOM_CHECK(a.dtype() == b.dtype(), op, ": expected both tensors to have the same dtype, got ", a.dtype(),
             " and ", b.dtype(), "; convert one with .to(dtype)");
}

// In-place ops cannot be recorded by loom's tape; refuse them where they would be.
// Note [In-place writes must not overlap]
// An in-place op writes each element of self once, reading `other` as it goes. If two
// elements of self are one memory location (an expanded view: stride 0), the location
// is written twice (x.expand({2, 3}).add_(1) adds 2). If `other` shares memory with self
// without being self element for element (a[1:].add_(a[:5])), later reads see earlier
// writes: a running sum instead of a sum. PyTorch refuses both, and so does loom. Like
// PyTorch's, the second check is by address ranges, for dense tensors (where ranges that
// meet do share elements); other layouts are not checked.
// `source`, if given, is what the op reads while it writes self.
inline void check_inplace(const char* op, const Tensor& self, const Tensor& source = Tensor()) {
  check_defined(op, self, "self");
  LOOM_CHECK(!(GradMode::is_enabled() && self.requires_grad()), op, ": a ",
             self.is_leaf() ? "leaf tensor" : "tensor", " that requires grad is being used in an in-place "
             "operation; wrap parameter updates in NoGradGuard, or use the out-of-place form");
  if (self.numel() == 0) return;  // an empty tensor writes nothing
  const Shape& sizes = self.shape();
  const Shape& strides = self.strides();
  for (size_t d = 0; d < sizes.size(); ++d)
    LOOM_CHECK(strides[d] != 0 || sizes[d] <= 1, op, ": more than one element of the written-to tensor refers to "
               "a single memory location (dim ", d, " of ", sizes, " is expanded, stride 0); write into a clone() "
               "instead");
  if (!source.defined() || source.numel() == 0 || self.storage() != source.storage()) return;
  if (!self.is_contiguous() || !source.is_contiguous()) return;
  const int64_t a = self.storage_offset(), b = source.storage_offset();
  if (a == b && sizes == source.shape()) return;  // self itself
  LOOM_CHECK(a + self.numel() <= b || b + source.numel() <= a, op, ": some elements of the input and of the "
             "written-to tensor refer to the same memory location (elements [", b, ", ", b + source.numel(),
             ") and [", a, ", ", a + self.numel(), ") of one storage), so the result would depend on the order of "
             "the writes; pass a clone() of the input");
}

inline void check_floating(const char* op, const Tensor& t) {
  LOOM_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", t.dtype());
}

// Where an op saves per-row statistics for its backward (layer_norm's mean and rstd,
// attention's log-sum-exp): the input's dtype, but float32 for 16-bit floats, as
// PyTorch's, since the backward exponentiates or divides by them.
inline TensorOptions statistics_options(const Tensor& input) {
  const bool half = input.dtype() == kFloat16 || input.dtype() == kBFloat16;
  return TensorOptions(half ? kFloat32 : input.dtype()).device(input.device());
}

}  // namespace loom::ops
