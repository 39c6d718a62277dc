// Checkpoints of an FSDP model in the single-process format: PyTorch's
// StateDictType.FULL_STATE_DICT with rank0_only, written as nn::save writes.
//
//   auto state = fsdp::full_state_dict(fsdp);         // collective; rank 0 gets every tensor
//   fsdp::save_full_state_dict(fsdp, "model.safetensors");   // collective; rank 0 writes
//   nn::load(*nn::resnet18(), "model.safetensors");  // a single-process model loads it as is
//   fsdp::load_full_state_dict(fsdp, state);           // every rank passes the full dict
//
// The keys are the wrapped module's own ("conv1.weight", "layer1.0.bn1.running_mean"),
// without any wrapper prefix: FSDP gathers each unit, so the module's parameters hold
// their full values for the moment of the copy, then frees them again.
#pragma once

#include <string>

#include "nn/optim/optimizer.h"  // defines: Optimizer
#include "nn/ordered_dict.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"

namespace loom::fsdp {

// Collective over the FSDP's groups. rank0_only: ranks other than rank 0 (of both groups)
// get an empty dict. Values are copies, on the parameters' device.
OrderedDict<Tensor> full_state_dict(FullyShardedDataParallel& fsdp, bool rank0_only = true);

// Collective; rank 0 writes `path` as nn::save would ({"format": "pt"} metadata).
void save_full_state_dict(FullyShardedDataParallel& fsdp, const std::string& path);

// Every rank: `state` holds the full tensors under the module's own names. Keys missing
// from it or not in the module are an error listing them; shapes must match. Each rank
// keeps its shard of every unit and its copy of every buffer. Not collective.
void load_full_state_dict(FullyShardedDataParallel& fsdp, const OrderedDict<Tensor>& state);

// The state of an optimizer built over fsdp.parameters() (the shards), consolidated: the
// optimizer's own state_dict (Note [Flat optimizer state]) in which every per-parameter
// tensor shaped like a shard (SGD's momentum_buffer) is replaced by the whole unit's
// [total] values, gathered from every rank without the padding (as PyTorch's
// FSDP.optim_state_dict consolidates, but keyed by unit rather than by original
// parameter). Under the per-parameter layout (fully_shard.h) the optimizer holds each
// parameter's local shard, and each state tensor shaped like one is gathered to the
// parameter's full shape. Collective; rank0_only as full_state_dict. For exact resumption.
OrderedDict<Tensor> full_optim_state_dict(FullyShardedDataParallel& fsdp, const optim::Optimizer& optimizer,
                                          bool rank0_only = true);
// Every rank: each rank keeps its shard of every consolidated tensor, then
// optimizer.load_state_dict. Not collective.
void load_full_optim_state_dict(FullyShardedDataParallel& fsdp, optim::Optimizer& optimizer,
                                const OrderedDict<Tensor>& state);

}  // namespace loom::fsdp
