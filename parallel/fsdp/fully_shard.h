// fully_shard: FSDP with every parameter cut on dim 0, as PyTorch's FSDP2
// (torch.distributed.fsdp.fully_shard). The optimizer sees one tensor per parameter, under
// the single-process names, so per-parameter decisions (AdamW's weight-decay exemptions,
// clipping) work as in one process.
//
//   // PyTorch:  fully_shard(model, mesh=mesh)
//   auto model = nn::resnet18(10);
//   auto fsdp = fsdp::fully_shard(model, distributed::default_group());
//   fsdp->named_parameters();          // "conv1.weight" [16, 3, 3, 3] on rank 0 of 4 (64 rows, cut)
//   auto groups = optim::param_groups_weight_decay(*fsdp, 0.05);   // biases and norms: no decay
//   optim::AdamW opt(groups, {.lr = 1e-3, .weight_decay = 0.05});
//   for (auto& batch : loader) {
//     Tensor loss = cross_entropy((*fsdp)(batch.data), batch.target);
//     opt.zero_grad();
//     loss.backward();                   // each local shard's .grad(): its rows of the average
//     fsdp::clip_grad_norm_(*fsdp, 1.0); // the whole model's norm (a collective)
//     opt.step();
//   }
//   for (auto& [name, w] : fsdp::named_dtensors(*fsdp)) w.full_tensor();  // DTensor Shard(0)
//
// Each parameter of shape [d0, rest...] keeps rows [r * ceil(d0 / N), ...) on rank r, as
// torch.chunk cuts (the last ranks may hold fewer rows, even none). It is the same
// FullyShardedDataParallel, units and runtime as the flat layout (FSDPOptions::
// per_parameter_sharding): one all-gather and one reduce-scatter per unit, the pieces
// copied in and out around them (Note [Per-parameter shards], per_parameter_layout.h).
// Checkpoints: state_dict.h and sharded_state_dict.h take either layout.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel, FSDPOptions
#include "parallel/tensor/dtensor.h"                     // defines: DTensor

namespace loom::fsdp {

// FullyShardedDataParallel(module, group, options) with per_parameter_sharding on.
// FULL_SHARD and SHARD_GRAD_OP shard over `group`; NO_SHARD replicates over it.
std::shared_ptr<FullyShardedDataParallel> fully_shard(std::shared_ptr<nn::Module> module,
                                                      std::shared_ptr<distributed::Communicator> group,
                                                      FSDPOptions options = {});
// HYBRID_SHARD (PyTorch: fully_shard over a 2-D mesh, HSDP): shard within the first group,
// all-reduce across the second. options.sharding_strategy must be HYBRID_SHARD.
std::shared_ptr<FullyShardedDataParallel> fully_shard(
    std::shared_ptr<nn::Module> module,
    std::pair<std::shared_ptr<distributed::Communicator>, std::shared_ptr<distributed::Communicator>> groups,
    FSDPOptions options);

// Each local shard as a DTensor, under its name: Shard(0) over the shard group with the
// parameter's global shape (a 0-d parameter as [1]); under NO_SHARD, Replicate() over the
// replicate group. The DTensors share the local shards (no copy). Needs the per-parameter
// layout (a loom::Error otherwise).
std::vector<std::pair<std::string, distributed::DTensor>> named_dtensors(const FullyShardedDataParallel& fsdp);

// torch.nn.utils.clip_grad_norm_ over fsdp.parameters() (either layout): the total
// norm is the whole model's, summed (p = inf: the max) over the shard group only, since
// HYBRID_SHARD's replicas hold the same gradients (Note [Clipping sharded gradients],
// nn/optim/clip_grad.h). Every rank of the groups calls it; returns the total norm (0-d,
// float64) before clipping.
Tensor clip_grad_norm_(FullyShardedDataParallel& fsdp, double max_norm, double norm_type = 2.0);

}  // namespace loom::fsdp
