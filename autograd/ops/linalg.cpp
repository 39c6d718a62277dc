// PLACEHOLDER (owner: linalg helper): replace with real implementations.
#include "autograd/ops.h"
namespace loom {
Tensor matmul(const Tensor&, const Tensor&) { LOOM_FAIL("matmul: not implemented yet"); }
Tensor mm(const Tensor&, const Tensor&) { LOOM_FAIL("mm: not implemented yet"); }
Tensor bmm(const Tensor&, const Tensor&) { LOOM_FAIL("bmm: not implemented yet"); }
Tensor linear(const Tensor&, const Tensor&, const Tensor&) { LOOM_FAIL("linear: not implemented yet"); }
}  // namespace loom
