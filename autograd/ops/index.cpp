// PLACEHOLDER (owner: indexing helper): replace with real implementations.
#include "autograd/ops.h"
namespace loom {
Tensor cat(const std::vector<Tensor>&, int64_t) { LOOM_FAIL("cat: not implemented yet"); }
Tensor stack(const std::vector<Tensor>&, int64_t) { LOOM_FAIL("stack: not implemented yet"); }
std::vector<Tensor> split(const Tensor&, int64_t, int64_t) { LOOM_FAIL("split: not implemented yet"); }
std::vector<Tensor> split_with_sizes(const Tensor&, const std::vector<int64_t>&, int64_t) { LOOM_FAIL("split: not implemented yet"); }
std::vector<Tensor> chunk(const Tensor&, int64_t, int64_t) { LOOM_FAIL("chunk: not implemented yet"); }
Tensor index_select(const Tensor&, int64_t, const Tensor&) { LOOM_FAIL("index_select: not implemented yet"); }
Tensor gather(const Tensor&, int64_t, const Tensor&) { LOOM_FAIL("gather: not implemented yet"); }
}  // namespace loom
