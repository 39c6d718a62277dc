// The whole model's gradient norm where each rank holds part of the gradients: FSDP's
// shards, a tensor-parallel weight's rows, a pipeline stage's parameters.
//
//   Tensor total = distributed::total_norm_over(my_grads, {shard_group}, 2.0);
//   nn::utils::clip_grads_with_norm_(my_params, 1.0, total);   // clip_grad_norm_, sharded
//
// Note [Clipping sharded gradients] (nn/optim/clip_grad.h) has the arithmetic: each rank's
// get_total_norm raised to the p-th power, summed over every group in turn (the max for
// p = inf), then the p-th root. Each element of the gradient must be held by exactly one
// rank of the groups named: a tensor every rank of a group holds whole is counted by one
// of them only (Note [Whose gradients a rank adds to the norm], train/grad_clipping.h).
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"                 // defines: Tensor
#include "parallel/comm/communicator.h"  // defines: Communicator

namespace loom::distributed {

// The p-norm of every rank's `grads` as one vector: a 0-d float64 tensor on the CPU, the
// same on every rank. Collective over each group of `groups` (null or one-rank groups are
// skipped); empty gradients add nothing.
Tensor total_norm_over(const std::vector<Tensor>& grads, const std::vector<std::shared_ptr<Communicator>>& groups,
                       double norm_type = 2.0);

}  // namespace loom::distributed
