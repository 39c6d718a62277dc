#include "train/grad_clipping.h"

#include <set>

#include "core/error.h"                 // defines: LOOM_CHECK
#include "nn/optim/clip_grad.h"         // defines: clip_grads_with_norm_
#include "parallel/fsdp/runtime.h"      // defines: ShardingStrategy
#include "parallel/sharded_norm.h"      // defines: total_norm_over

namespace loom::training {
GradClipper::GradClipper(const ParallelModel& parallel, optim::Optimizer& optimizer,
                         const distributed::ParallelDims& dims, const distributed::DeviceMesh* mesh, double max_norm)
    : optimizer_(optimizer), max_norm_(max_norm) {
  LOOM_CHECK(max_norm > 0, "--clip-grad-norm: expected a positive norm, got ", max_norm);
  bool per_parameter = !parallel.sharded_parts.empty();
  for (const ParallelModel::ShardedPart& part : parallel.sharded_parts)
    per_parameter = per_parameter && part.fsdp->per_parameter_sharding();
  LOOM_CHECK(!(dims.tp_enabled() && dims.dp_shard_enabled()) || (per_parameter && !dims.pp_enabled()),
             "--clip-grad-norm with --tp ", dims.tp, " and --dp-shard ", dims.dp_shard, dims.pp_enabled() ? " and --pp" : "",
             ": FSDP's flat shards mix tensor-parallel shards with tensors every tp rank holds whole, so their norm "
             "cannot be summed over the ranks (Note [Whose gradients a rank adds to the norm]); use --fsdp-layout "
             "per_parameter (without --pp), clip under --tp with --dp-replicate, or under --dp-shard without --tp");
  for (const auto& group : optimizer.param_groups())
    for (const Tensor& p : group.params) params_.push_back(p);
  // See Note [Whose gradients a rank adds to the norm].
  std::set<const TensorImpl*> split;
  for (const auto& [name, p] : parallel.model->named_parameters())
    if (parallel.tp_placements.contains(name)) split.insert(p.unsafe_impl());
  // FSDP2's local rows are tensors of their own, under the model's names (one part: no --pp).
  if (per_parameter && !dims.pp_enabled())
    for (const auto& [name, p] : parallel.sharded_parts.front().fsdp->named_parameters())
      if (parallel.tp_placements.contains(name)) split.insert(p.unsafe_impl());
  const bool tp_rank0 = !dims.tp_enabled() || mesh->group("tp")->rank() == 0;
  for (const Tensor& p : params_)
    if (tp_rank0 || split.count(p.unsafe_impl())) counted_.push_back(p);
  if (mesh == nullptr) return;
  const auto* fsdp = parallel.sharded_parts.empty() ? nullptr : parallel.sharded_parts.front().fsdp.get();
  const bool sharded = dims.dp_shard_enabled() && fsdp && fsdp->sharding_strategy() != fsdp::ShardingStrategy::NO_SHARD;
  for (const char* dim : {"pp", "dp_shard", "tp"})
    if (mesh->has(dim) && (std::string(dim) != "dp_shard" || sharded)) sum_over_.push_back(mesh->group(dim));
}

double GradClipper::clip(MixedPrecision& amp) {
  amp.scaler().unscale_(optimizer_);  // the true gradients (a no-op without --amp fp16)
  std::vector<Tensor> grads;
  for (const Tensor& p : counted_)
    if (p.grad().defined()) grads.push_back(p.grad());
  const Tensor total = distributed::total_norm_over(grads, sum_over_);
  nn::utils::clip_grads_with_norm_(params_, max_norm_, total);
  return total.item<double>();
}

}  // namespace loom::training
