// An optimizer's state as pieces of logical tensors named after the parameters (DCP's
// get_optimizer_state_dict with fully-qualified names), so that momentum and AdamW's
// moments reshard with their parameters: under FSDP2 "fc.weight"'s exp_avg is rows of
// "optim.fc.weight.exp_avg"; under FSDP1 a flat shard's momentum holds slices of many.
//
//   std::map<const TensorImpl*, LocalTensor> params = ...;   // each stepped parameter's pieces
//   ShardedState mine = optimizer_pieces(optimizer, params);  // beside the model's, into pack()
//   ...
//   load_optimizer_state(optimizer, index, params);           // under any other layout
//
// Note [Optimizer state by name]
// optim's own state_dict numbers parameters across groups (Note [Flat optimizer state]),
// and the numbers mean nothing under another layout: FSDP1 steps one flat shard per unit,
// a pipeline stage only its own layers. Here a state tensor shaped like its parameter (SGD's
// momentum_buffer, AdamW's exp_avg, exp_avg_sq) takes its parameter's pieces, renamed
// "optim.<parameter>.<state>"; a 0-d one (AdamW's step) is saved whole under each name its
// parameter holds a piece of. Group hyperparameters go under "optim.param_groups.<g>.<key>"
// (rank 0 writes them). Loading builds this layout's state_dict (its own numbering and
// groups) from the pieces and hands it to load_state_dict; a parameter whose state is not
// in the checkpoint (no step was taken) gets none, as in PyTorch.
#pragma once

#include <map>

#include "nn/optim/optimizer.h"                // defines: Optimizer
#include "parallel/checkpoint/load_plan.h"     // defines: CheckpointIndex
#include "parallel/checkpoint/sharded_state.h" // defines: LocalTensor, ShardedState

namespace loom::distributed::checkpoint {

using ParamPieces = std::map<const TensorImpl*, LocalTensor>;

// "optim.<name>.<state>" for a parameter piece named `name`.
std::string optimizer_state_name(const std::string& parameter, const std::string& state);

// The state of every parameter of `optimizer` found in `params` (a parameter not there is a
// loom::Error: the caller described another set than the optimizer steps). A state is
// written where its parameter is, or always with `state_owned` (ZeRO-1: the owner alone
// holds the state of a parameter every rank holds); hyperparameters where
// `write_hyperparameters`.
ShardedState optimizer_pieces(const optim::Optimizer& optimizer, const ParamPieces& params, bool state_owned,
                              bool write_hyperparameters);

// Fills `optimizer`'s state from `index` for each of its parameters (in `params`), and its
// groups' hyperparameters; see Note [Optimizer state by name]. Returns how many parameters
// got state.
int load_optimizer_state(optim::Optimizer& optimizer, const CheckpointIndex& index, const ParamPieces& params);

}  // namespace loom::distributed::checkpoint
