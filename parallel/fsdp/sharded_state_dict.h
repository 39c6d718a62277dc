// Checkpoints of an FSDP model as shards: PyTorch's StateDictType.SHARDED_STATE_DICT.
// Each rank saves what it holds -- its shard of every unit's flat parameter, its copy of
// the buffers -- and loads the same back, with no communication at all; a full state dict
// (state_dict.h) instead gathers every unit onto rank 0.
//
//   OrderedDict<Tensor> mine = fsdp::sharded_state_dict(fsdp);        // not collective
//   safetensors::Metadata layout = fsdp::sharding_metadata(fsdp);     // what makes it fit
//   ... every rank writes mine + layout (parallel/distributed_checkpoint.h) ...
//   fsdp::check_sharded_compatible(fsdp, saved_layout, "step-00000012/shard-0-of-2");
//   fsdp::load_sharded_state_dict(fsdp, mine);
//
// Keys: "flat_param_<k>" (the FSDP module's own parameter names: unit k's shard, padding
// included) and the wrapped module's buffers under their own names. The optimizer built
// over fsdp.parameters() already holds shard-shaped state: its own state_dict() is its
// sharded state dict, and load_state_dict takes it back.
//
// Note [What a shard must agree on]
// A shard is only meaningful in the cut that produced it (Note [Same world, same layout]
// in parallel/distributed_checkpoint.h). sharding_metadata records that cut: the world
// size, the strategy, the shard group's size (HYBRID_SHARD cuts within it), the layout
// when it is per-parameter (Note [Per-parameter shards]: a shard of it holds each
// parameter's rows, padded per parameter, not a slice of the flat buffer), and per
// unit its parameters' names, the flat parameter's total and padded numel, the shard size
// and the dtype. check_sharded_compatible compares every field and names each that
// differs, expected against found, so a resume with the wrong world size or
// sharding strategy fails at once instead of loading a shard into the wrong place.
#pragma once

#include <string>

#include "nn/ordered_dict.h"
#include "nn/safetensors.h"                             // defines: safetensors::Metadata
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel

namespace loom::fsdp {

// This rank's shards and buffers, as copies. Not collective.
OrderedDict<Tensor> sharded_state_dict(const FullyShardedDataParallel& fsdp);

// Every rank: `state` is what sharded_state_dict returned on this rank (of an FSDP with
// the same layout: check_sharded_compatible first). Missing or unexpected keys and wrong
// shapes are a loom::Error naming them. Not collective.
void load_sharded_state_dict(FullyShardedDataParallel& fsdp, const OrderedDict<Tensor>& state);

// The cut this rank's shards belong to, as "fsdp.*" text entries for a shard's metadata.
// See Note [What a shard must agree on].
safetensors::Metadata sharding_metadata(const FullyShardedDataParallel& fsdp);

// A loom::Error when `saved` (sharding_metadata of the run that wrote the shard at
// `source`) differs from this FSDP's: every differing field, saved against now, and what
// to do about it. Keys other than "fsdp.*" are ignored.
void check_sharded_compatible(const FullyShardedDataParallel& fsdp, const safetensors::Metadata& saved,
                              const std::string& source);

}  // namespace loom::fsdp
