#include "examples/train/optimizer.h"

#include "core/error.h"                            // defines: LOOM_CHECK
#include "nn/optim/sgd.h"                          // defines: SGD
#include "parallel/zero_redundancy_optimizer.h"    // defines: ZeroRedundancyOptimizer

namespace loom::examples {

std::unique_ptr<optim::Optimizer> build_optimizer(const std::vector<Tensor>& params,
                                                  const distributed::DeviceMesh* mesh, const TrainConfig& config,
                                                  double lr) {
  const optim::SGDOptions sgd{.lr = lr, .momentum = config.momentum, .weight_decay = config.weight_decay,
                              .nesterov = config.nesterov};
  if (!config.zero_redundancy_optimizer) return std::make_unique<optim::SGD>(params, sgd);
  LOOM_CHECK(mesh != nullptr && mesh->has("dp_replicate"), "--zero-redundancy-optimizer shards the optimizer state "
             "over DDP's replicas: it needs --dp-replicate (or --mode ddp) under loomrun");
  // The group DDP averages the gradients over: its ranks hold the same parameters.
  return std::make_unique<parallel::ZeroRedundancyOptimizer>(
      params, parallel::optimizer_class<optim::SGD>(sgd), mesh->group("dp_replicate"));
}

parallel::ZeroRedundancyOptimizer* zero_redundancy_of(const optim::Optimizer& optimizer) {
  return dynamic_cast<parallel::ZeroRedundancyOptimizer*>(const_cast<optim::Optimizer*>(&optimizer));
}

void gather_optimizer_state(optim::Optimizer& optimizer) {
  if (auto* zero = zero_redundancy_of(optimizer)) zero->consolidate_state_dict(0);
}

}  // namespace loom::examples
