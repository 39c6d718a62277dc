// A tensor-parallel model's state as a single process would have it, and back: the
// checkpoint side of parallelize_module (parallelize_module.h).
//
//   StatePlacements placements = parallelize_module(*model, tp, resnet_tp_plan(*model));
//   auto state = full_state_dict(*model, placements);   // every rank: resnet18's 122 entries, whole
//   save_file(state, "model.safetensors");              // the file a single-process run writes
//   load_full_state_dict(*model, state, placements);    // each rank keeps its rows again
//
// A sharded checkpoint saves each rank's own state_dict() (its shards under the single-
// process names) beside `placements`, which says how each split tensor was cut: the
// tensor_parallel_placements entry of the checkpoint's metadata (describe_placements).
#pragma once

#include <string>

#include "nn/module.h"                       // defines: Module
#include "nn/ordered_dict.h"                 // defines: OrderedDict
#include "parallel/tensor/parallel_style.h"  // defines: StatePlacements

namespace loom::distributed {

// module.state_dict() with every tensor named in `placements` all-gathered over its group
// into the whole tensor. A collective over each group in `placements`: every rank of it
// calls this. The other entries are this rank's own (replicated) tensors, shared as
// state_dict() shares them.
OrderedDict<Tensor> full_state_dict(const nn::Module& module, const StatePlacements& placements);
// The same from a state_dict already taken (FSDP's full_state_dict of a split model, say):
// each entry named in `placements` gathered whole, the rest as given.
OrderedDict<Tensor> gather_tp_state(OrderedDict<Tensor> state, const StatePlacements& placements);

// Copies a whole state_dict (a single-process run's, or full_state_dict's) into a split
// module: each split tensor gets this rank's rows, the others all of it. No communication.
// Shapes are checked against the global shapes in `placements`; strict as load_state_dict.
void load_full_state_dict(nn::Module& module, const OrderedDict<Tensor>& state, const StatePlacements& placements);

// One line per split tensor, "layer1.0.conv1.weight Shard(dim=0) [64, 64, 3, 3]": what a
// sharded checkpoint records beside each rank's shards.
std::string describe_placements(const StatePlacements& placements);

}  // namespace loom::distributed
