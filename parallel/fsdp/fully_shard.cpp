#include "parallel/fsdp/fully_shard.h"

#include <cmath>  // defines: std::pow, std::isinf
#include <map>

#include "core/error.h"
#include "core/factory.h"        // defines: full
#include "nn/optim/clip_grad.h"  // defines: get_total_norm, clip_grads_with_norm_

namespace loom::fsdp {

using distributed::Communicator;

std::shared_ptr<FullyShardedDataParallel> fully_shard(std::shared_ptr<nn::Module> module,
                                                      std::shared_ptr<Communicator> group, FSDPOptions options) {
  options.per_parameter_sharding = true;
  return std::make_shared<FullyShardedDataParallel>(std::move(module), std::move(group), std::move(options));
}

std::shared_ptr<FullyShardedDataParallel> fully_shard(
    std::shared_ptr<nn::Module> module, std::pair<std::shared_ptr<Communicator>, std::shared_ptr<Communicator>> groups,
    FSDPOptions options) {
  options.per_parameter_sharding = true;
  return std::make_shared<FullyShardedDataParallel>(std::move(module), std::move(groups), std::move(options));
}

std::vector<std::pair<std::string, distributed::DTensor>> named_dtensors(const FullyShardedDataParallel& fsdp) {
  LOOM_CHECK(fsdp.per_parameter_sharding(), "fsdp::named_dtensors: this FSDP has the flat layout, whose shards are "
             "slices of each unit's flat buffer, not of a parameter; build it with fsdp::fully_shard (or "
             "FSDPOptions::per_parameter_sharding) for a DTensor per parameter");
  std::map<const TensorImpl*, Shape> global_shape;
  for (const Unit& unit : fsdp.units()) {
    if (!unit.flat) continue;
    for (size_t i = 0; i < unit.flat->local_shards().size(); ++i) {
      const Shape& shape = unit.flat->shapes()[i];
      global_shape.emplace(unit.flat->local_shards()[i].unsafe_impl(), shape.empty() ? Shape{1} : shape);
    }
  }
  const bool sharded = fsdp.shard_group() != nullptr;
  std::vector<std::pair<std::string, distributed::DTensor>> out;
  for (const auto& [name, local] : fsdp.named_parameters()) {
    const Shape& shape = global_shape.at(local.unsafe_impl());
    out.emplace_back(name, sharded ? distributed::DTensor::from_local(local, fsdp.shard_group(), distributed::Shard(0),
                                                                      shape)
                                   : distributed::DTensor::from_local(local, fsdp.replicate_group(),
                                                                      distributed::Replicate(), shape));
  }
  return out;
}

Tensor clip_grad_norm_(FullyShardedDataParallel& fsdp, double max_norm, double norm_type) {
  const std::vector<Tensor> params = fsdp.parameters();
  std::vector<Tensor> grads;  // an empty local shard adds nothing (and has no max)
  for (const Tensor& p : params)
    if (p.grad().defined() && p.grad().numel() > 0) grads.push_back(p.grad());
  const bool inf = std::isinf(norm_type);
  const double local = nn::utils::get_total_norm(grads, norm_type).to(kFloat64).item<double>();
  // The flat layout's padding and the per-parameter layout's pieces hold no gradient
  // twice: every element of the model's gradient is on exactly one rank of the shard group.
  Tensor total = full({}, inf ? local : std::pow(local, norm_type), TensorOptions(kFloat64));
  if (const auto& group = fsdp.shard_group(); group && group->size() > 1) {
    Tensor travelling = distributed::to_communication_device(total, *group);
    group->all_reduce(travelling, inf ? distributed::ReduceOp::Max : distributed::ReduceOp::Sum)->wait();
    total = travelling.to(Device(DeviceType::CPU));
  }
  if (!inf) total = full({}, std::pow(total.item<double>(), 1.0 / norm_type), TensorOptions(kFloat64));
  nn::utils::clip_grads_with_norm_(params, max_norm, total);
  return total;
}

}  // namespace loom::fsdp
