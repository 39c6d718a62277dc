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
inline void check_inplace(const char* op, const Tensor& self) {
  check_defined(op, self, "self");
  LOOM_CHECK(!(GradMode::is_enabled() && self.requires_grad()), op, ": a ",
             self.is_leaf() ? "leaf tensor" : "tensor", " that requires grad is being used in an in-place "
             "operation; wrap parameter updates in NoGradGuard, or use the out-of-place form");
}

inline void check_floating(const char* op, const Tensor& t) {
  LOOM_CHECK(is_floating(t.dtype()), op, ": expected a floating-point tensor, got ", t.dtype());
}

}  // namespace loom::ops
