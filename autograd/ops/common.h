// Checks shared by the differentiable ops: the error messages users see most.
#pragma once

#include "autograd/grad_mode.h"
#include "autograd/saved_tensor.h"
#include "autograd/variable.h"
#include "core/error.h"
#include "core/tensor.h"

namespace loom::ops {

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
inline void check_inplace(const char* op, const Tensor& self) {
  check_defined(op, self, "self");
  LOOM_CHECK(!(GradMode::is_enabled() && self.requires_grad()), op, ": a ",
             self.is_leaf() ? "leaf tensor" : "tensor", " that requires grad is being used in an in-place "
             "operation; wrap parameter updates in NoGradGuard, or use the out-of-place form");
  for (int64_t d = 0; d < self.dim() && self.numel() > 0; ++d)  // an empty tensor writes nothing
    LOOM_CHECK(self.stride(d) != 0 || self.size(d) <= 1, op, ": more than one element of the written-to tensor "
               "refers to a single memory location (dim ", d, " of ", self.shape(), " is expanded, stride 0); "
               "write into a clone() instead");
}

// See Note [In-place writes must not overlap].
inline void check_no_partial_overlap(const char* op, const Tensor& self, const Tensor& other) {
  if (self.storage() != other.storage() || self.numel() == 0 || other.numel() == 0) return;
  if (!self.is_contiguous() || !other.is_contiguous()) return;
  if (self.storage_offset() == other.storage_offset() && self.shape() == other.shape()) return;  // self itself
  const int64_t a = self.storage_offset(), b = other.storage_offset();
  LOOM_CHECK(a + self.numel() <= b || b + other.numel() <= a, op, ": some elements of the input and of the "
             "written-to tensor refer to the same memory location (elements [", b, ", ", b + other.numel(),
             ") and [", a, ", ", a + self.numel(), ") of one storage), so the result would depend on the order of "
             "the writes; pass a clone() of the input");
}

inline void check_floating(const char* op, const Tensor& t) {
  LOOM_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", t.dtype());
}

}  // namespace loom::ops
