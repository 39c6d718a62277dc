// ShardedGradScaler: float16 loss scaling where each rank holds only part of the
// gradients, as torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler.
//
//   distributed::ShardedGradScaler scaler({world});   // or {mesh.group("dp_shard"), ...}
//   scaler.scale(loss).backward();
//   scaler.step(opt);       // every rank steps, or every rank skips
//   scaler.update();        // so every rank's scale stays the same
//
// Note [One verdict on inf for every rank]
// GradScaler skips a step whose gradients hold an inf or NaN and halves its scale (Note
// [Dynamic loss scale], nn/optim/grad_scaler.h). Under DDP every rank holds the same
// all-reduced gradients, so each reaches the same verdict alone. Under FSDP a rank sees
// only its shard of each gradient (a pipeline stage only its stage's, a tensor-parallel
// rank only its rows): an overflow in rank 0's shard makes rank 0 skip while rank 1
// steps, and from then on the ranks hold pieces of two different models and two scales,
// silently. So the verdict is reduced with MAX over the groups that split the gradients
// (PyTorch's ShardedGradScaler all-reduces its found_inf over its process group): one
// 4-byte all-reduce per group per step, and only under float16.
#pragma once

#include <memory>
#include <vector>

#include "nn/optim/grad_scaler.h"        // defines: GradScaler, GradScalerOptions
#include "parallel/comm/communicator.h"  // defines: Communicator

namespace loom::distributed {

class ShardedGradScaler : public optim::GradScaler {
 public:
  // `groups`: every group over which the gradients are split (the whole world is always
  // enough). Null and one-rank groups are skipped. unscale_ and step are then collective
  // over them: every rank calls them for the same optimizers in the same order.
  explicit ShardedGradScaler(std::vector<std::shared_ptr<Communicator>> groups, optim::GradScalerOptions options = {});

 protected:
  bool found_inf_anywhere(bool found_here) override;

 private:
  std::vector<std::shared_ptr<Communicator>> groups_;
};

}  // namespace loom::distributed
