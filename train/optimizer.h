// The optimizer the loop steps: SGD (or, --optimizer adamw, AdamW with timm's weight-decay
// groups) over the model's parameters, or, with --mode ddp
// --zero-redundancy-optimizer, the same SGD inside ZeroRedundancyOptimizer over the
// data-parallel group (ZeRO-1: each rank keeps the momentum of its partition only;
// parallel/zero_redundancy_optimizer.h). Like parallelize(), decided once from the flags:
// the loop calls step() and never asks which it got. As torchtitan's build_optimizers.
#pragma once

#include <functional>
#include <memory>
#include <string>
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

// A parameter of the plain model as a whole: its name and its number of dimensions (which
// sharding does not keep: FSDP empties the model's own parameter objects).
struct WholeParameter {
  std::string name;
  int64_t dim = 0;
};
// For a tensor this rank steps, the plain model's parameters it holds pieces of: one for a
// parameter itself, its tensor-parallel part or its per-parameter FSDP shard (under --pp
// too, where a stage's FSDP names its shards after the stage, not the model); several for
// FSDP1's flat shard; none for a tensor that is no parameter's.
using ModelParametersOf = std::function<std::vector<WholeParameter>(const Tensor&)>;

// `params`: what this rank steps (the model's, a wrapper's, a stage's). `model`: the plain
// model, whose parameters say which get no weight decay under --optimizer adamw and
// --no-decay-norms-and-biases; `parameters_of` maps the stepped tensors to them. `mesh` is
// null in one process. `lr` is --lr after --lr-scaling.
BuiltOptimizer build_optimizer(const std::vector<Tensor>& params, const nn::Module& model,
                               const ModelParametersOf& parameters_of, const distributed::DeviceMesh* mesh,
                               const TrainConfig& config, double lr);

// parameters_of for an optimizer over `model`'s own, unsharded parameters (one process).
ModelParametersOf own_parameters(const nn::Module& model);

}  // namespace loom::training
