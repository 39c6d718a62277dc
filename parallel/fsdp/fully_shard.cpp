#include "parallel/fsdp/fully_shard.h"

#include <map>

#include "core/error.h"
#include "nn/optim/clip_grad.h"      // defines: clip_grads_with_norm_
#include "parallel/sharded_norm.h"   // defines: total_norm_over

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
  std::vector<Tensor> grads;
  for (const Tensor& p : params) grads.push_back(p.grad());
  // The flat layout's padding and the per-parameter layout's pieces hold no gradient
  // twice: every element of the model's gradient is on exactly one rank of the shard group.
  Tensor total = distributed::total_norm_over(grads, {fsdp.shard_group()}, norm_type);
  nn::utils::clip_grads_with_norm_(params, max_norm, total);
  return total;
}

}  // namespace loom::fsdp
