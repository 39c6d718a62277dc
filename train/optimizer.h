// The optimizer the loop steps: SGD (or, --optimizer adamw, AdamW with timm's weight-decay
// groups) over the model's parameters, or, with --mode ddp
// --zero-redundancy-optimizer, the same SGD inside ZeroRedundancyOptimizer over the
// data-parallel group (ZeRO-1: each rank keeps the momentum of its partition only;
// parallel/zero_redundancy_optimizer.h). Like parallelize(), decided once from the flags:
// the loop calls step() and never asks which it got. As torchtitan's build_optimizers.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"                 // defines: Tensor
#include "train/trainer.h"      // defines: TrainConfig
#include "nn/module.h"                   // defines: Module
#include "nn/optim/optimizer.h"          // defines: Optimizer
#include "parallel/device_mesh.h"        // defines: DeviceMesh

namespace loom::parallel {
class ZeroRedundancyOptimizer;
}  // namespace loom::parallel

namespace loom::training {

// What build_optimizer made: the optimizer the loop steps and, under ZeRO-1, the same
// object as the ZeroRedundancyOptimizer whose state is partitioned (so no one has to ask
// the optimizer what it is).
struct BuiltOptimizer {
  std::unique_ptr<optim::Optimizer> optimizer;
  parallel::ZeroRedundancyOptimizer* zero_redundancy = nullptr;  // --zero-redundancy-optimizer, else null

  optim::Optimizer& operator*() const { return *optimizer; }
  // The optimizer whose state this rank holds: ZeRO-1's partition (null when this rank
  // owns none of the parameters), or the optimizer itself.
  optim::Optimizer* local() const;
  // Collective under --zero-redundancy-optimizer: gathers the whole optimizer state on
  // rank 0 of the data-parallel group, so that its state_dict() (save_checkpoint) is a
  // plain SGD's. Every rank calls it before rank 0 saves; a no-op for a plain optimizer.
  void gather_state() const;
};

// `params`: what this rank steps (the model's, a wrapper's, a stage's). `model`: the plain
// model, whose parameters say which get no weight decay under --optimizer adamw; `wrapped`:
// the module the loop runs, whose parameter names map the stepped tensors to the model's
// (under per-parameter FSDP each parameter's local shard carries its name). `mesh` is null
// in one process. `lr` is --lr after --lr-scaling.
BuiltOptimizer build_optimizer(const std::vector<Tensor>& params, const nn::Module& model, const nn::Module& wrapped,
                               const distributed::DeviceMesh* mesh, const TrainConfig& config, double lr);

}  // namespace loom::training
