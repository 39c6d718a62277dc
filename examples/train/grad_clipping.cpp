#include "examples/train/grad_clipping.h"

#include <cmath>  // defines: std::sqrt
#include <set>

#include "core/error.h"                 // defines: LOOM_CHECK
#include "core/factory.h"               // defines: full (the sum that travels)
#include "nn/optim/clip_grad.h"         // defines: get_total_norm, clip_grads_with_norm_
#include "parallel/fsdp/runtime.h"      // defines: ShardingStrategy

namespace loom::examples {
namespace {

// The sum of squares of `grads` (the 2-norm of all of them as one vector, squared).
double squared_norm(const std::vector<Tensor>& grads) {
  if (grads.empty()) return 0.0;
  const double norm = nn::utils::get_total_norm(grads).to(kFloat64).item<double>();
  return norm * norm;
}

}  // namespace

double clip_grad_norm(const ParallelModel& parallel, optim::Optimizer& optimizer,
                      const distributed::ParallelDims& dims, const distributed::DeviceMesh* mesh,
                      MixedPrecision& amp, double max_norm) {
  LOOM_CHECK(max_norm > 0, "--clip-grad-norm: expected a positive norm, got ", max_norm);
  LOOM_CHECK(!(dims.tp_enabled() && dims.dp_shard_enabled()), "--clip-grad-norm with --tp ", dims.tp, " and "
             "--dp-shard ", dims.dp_shard, ": FSDP's flat shards mix tensor-parallel shards with tensors every tp rank "
             "holds whole, so their norm cannot be summed over the ranks (Note [Whose gradients a rank adds to the "
             "norm]); clip under --tp with --dp-replicate, or under --dp-shard without --tp");
  amp.scaler().unscale_(optimizer);  // the true gradients (a no-op without --amp fp16)
  std::vector<Tensor> params;
  for (const auto& group : optimizer.param_groups())
    for (const Tensor& p : group.params) params.push_back(p);
  // See Note [Whose gradients a rank adds to the norm].
  std::set<const TensorImpl*> split;
  for (const auto& [name, p] : parallel.model->named_parameters())
    if (parallel.tp_placements.contains(name)) split.insert(p.unsafe_impl());
  const bool tp_rank0 = !dims.tp_enabled() || mesh->group("tp")->rank() == 0;
  std::vector<Tensor> mine;
  for (const Tensor& p : params)
    if (p.grad().defined() && (tp_rank0 || split.count(p.unsafe_impl()))) mine.push_back(p.grad());
  double sum = squared_norm(mine);
  if (mesh != nullptr) {
    const auto* fsdp = parallel.sharded_parts.empty() ? nullptr : parallel.sharded_parts.front().fsdp.get();
    const bool sharded = dims.dp_shard_enabled() && fsdp && fsdp->sharding_strategy() != fsdp::ShardingStrategy::NO_SHARD;
    Tensor total = full({}, sum, TensorOptions(kFloat64));
    for (const char* dim : {"pp", "dp_shard", "tp"}) {
      if (!mesh->has(dim) || (std::string(dim) == "dp_shard" && !sharded)) continue;
      mesh->group(dim)->all_reduce(total)->wait();
    }
    sum = total.item<double>();
  }
  const double norm = std::sqrt(sum);
  nn::utils::clip_grads_with_norm_(params, max_norm, full({}, norm, TensorOptions(kFloat64)));
  return norm;
}

}  // namespace loom::examples
