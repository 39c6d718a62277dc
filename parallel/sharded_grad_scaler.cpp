#include "parallel/sharded_grad_scaler.h"

#include "core/factory.h"  // defines: full

namespace loom::distributed {

ShardedGradScaler::ShardedGradScaler(std::vector<std::shared_ptr<Communicator>> groups,
                                     optim::GradScalerOptions options)
    : GradScaler(options), groups_(std::move(groups)) {}

// See Note [One verdict on inf for every rank].
bool ShardedGradScaler::found_inf_anywhere(bool found_here) {
  float found = found_here ? 1.0f : 0.0f;
  for (const auto& group : groups_) {
    if (!group || group->size() <= 1) continue;
    Tensor travelling = to_communication_device(full({1}, found, TensorOptions(kFloat32)), *group);
    group->all_reduce(travelling, ReduceOp::Max)->wait();
    found = travelling.to(Device(DeviceType::CPU)).item<float>();
  }
  return found != 0.0f;
}

}  // namespace loom::distributed
