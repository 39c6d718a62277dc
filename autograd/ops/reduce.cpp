// PLACEHOLDER (owner: reductions helper): replace with real implementations.
#include "autograd/ops.h"
namespace loom {
Tensor sum(const Tensor&) { LOOM_FAIL("sum: not implemented yet"); }
Tensor sum(const Tensor&, const Shape&, bool) { LOOM_FAIL("sum: not implemented yet"); }
Tensor mean(const Tensor&) { LOOM_FAIL("mean: not implemented yet"); }
Tensor mean(const Tensor&, const Shape&, bool) { LOOM_FAIL("mean: not implemented yet"); }
Tensor var(const Tensor&, const Shape&, bool, bool) { LOOM_FAIL("var: not implemented yet"); }
Tensor max(const Tensor&) { LOOM_FAIL("max: not implemented yet"); }
Tensor min(const Tensor&) { LOOM_FAIL("min: not implemented yet"); }
std::pair<Tensor, Tensor> max(const Tensor&, int64_t, bool) { LOOM_FAIL("max: not implemented yet"); }
std::pair<Tensor, Tensor> min(const Tensor&, int64_t, bool) { LOOM_FAIL("min: not implemented yet"); }
Tensor argmax(const Tensor&, int64_t, bool) { LOOM_FAIL("argmax: not implemented yet"); }
}  // namespace loom
