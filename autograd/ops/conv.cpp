// PLACEHOLDER (owner: conv2d helper): replace with the real implementation.
#include "autograd/ops.h"
namespace loom {
Tensor conv2d(const Tensor&, const Tensor&, const Tensor&, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t) { LOOM_FAIL("conv2d: not implemented yet"); }
}  // namespace loom
