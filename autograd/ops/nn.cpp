// PLACEHOLDER (owner: nn-kernels helper): replace with real implementations.
#include "autograd/ops.h"
namespace loom {
Tensor max_pool2d(const Tensor&, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, bool) { LOOM_FAIL("max_pool2d: not implemented yet"); }
Tensor avg_pool2d(const Tensor&, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, bool, bool) { LOOM_FAIL("avg_pool2d: not implemented yet"); }
Tensor adaptive_avg_pool2d(const Tensor&, std::vector<int64_t>) { LOOM_FAIL("adaptive_avg_pool2d: not implemented yet"); }
Tensor batch_norm(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double, double) { LOOM_FAIL("batch_norm: not implemented yet"); }
Tensor log_softmax(const Tensor&, int64_t) { LOOM_FAIL("log_softmax: not implemented yet"); }
Tensor softmax(const Tensor&, int64_t) { LOOM_FAIL("softmax: not implemented yet"); }
Tensor nll_loss(const Tensor&, const Tensor&, const Tensor&, Reduction, int64_t) { LOOM_FAIL("nll_loss: not implemented yet"); }
Tensor cross_entropy(const Tensor&, const Tensor&, const Tensor&, Reduction, int64_t, double) { LOOM_FAIL("cross_entropy: not implemented yet"); }
Tensor dropout(const Tensor&, double, bool, Generator*) { LOOM_FAIL("dropout: not implemented yet"); }
}  // namespace loom
