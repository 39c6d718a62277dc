#include "parallel/sharded_norm.h"

#include <cmath>  // defines: std::pow, std::sqrt, std::isinf

#include "core/factory.h"        // defines: full
#include "nn/optim/clip_grad.h"  // defines: get_total_norm

namespace loom::distributed {

Tensor total_norm_over(const std::vector<Tensor>& grads, const std::vector<std::shared_ptr<Communicator>>& groups,
                       double norm_type) {
  std::vector<Tensor> held;  // an empty shard adds nothing (and has no max)
  for (const Tensor& g : grads)
    if (g.defined() && g.numel() > 0) held.push_back(g);
  const bool inf = std::isinf(norm_type);
  const double local = nn::utils::get_total_norm(held, norm_type).to(kFloat64).item<double>();
  double total = inf ? local : norm_type == 2.0 ? local * local : std::pow(local, norm_type);
  for (const auto& group : groups) {
    if (!group || group->size() <= 1) continue;
    Tensor travelling = to_communication_device(full({}, total, TensorOptions(kFloat64)), *group);
    group->all_reduce(travelling, inf ? ReduceOp::Max : ReduceOp::Sum)->wait();
    total = travelling.to(Device(DeviceType::CPU)).item<double>();
  }
  if (!inf) total = norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
  return full({}, total, TensorOptions(kFloat64));
}

}  // namespace loom::distributed
