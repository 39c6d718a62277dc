// What an FSDP module holds of its model's parameters, as pieces of them (sharded_state.h):
// each tensor its optimizer steps -- a unit's flat shard (FSDP1) or a parameter's local
// rows (FSDP2) -- with the boxes of the named parameters it stores. This is what lets a
// flat shard saved at one world size load as FSDP2 rows at another, or whole in one process.
//
//   ParamPieces mine = fsdp_param_pieces(*fsdp, name_of, untranslated, /*write=*/true);
//   // flat:  flat_param_0 -> {conv1.weight [0:5, 0:3, 0:3, 0:3] at 0, bn1.weight [0:3] at 135, ...}
//   // FSDP2: conv1.weight's rows 0..7 -> {conv1.weight [0:8, 0:3, 0:3, 0:3] at 0}
//
// Under tensor parallelism FSDP shards each parameter's TP-local tensor: `global_of` says
// where that local tensor lies in the whole parameter (its box, from the TP placements),
// and every piece is moved there (Note [Every layout is a set of boxes], chunks.h).
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "parallel/checkpoint/optimizer_state.h"         // defines: ParamPieces
#include "parallel/fsdp/fully_sharded_data_parallel.h"   // defines: FullyShardedDataParallel

namespace loom::distributed::checkpoint {

// For a parameter's name and its local (unsharded by FSDP) shape: the logical tensor's
// global shape and the box the local tensor is of it.
using GlobalOf = std::function<std::pair<Shape, Chunk>(const std::string& name, const Shape& local_shape)>;
// No tensor parallelism: the local tensor is the whole parameter.
std::pair<Shape, Chunk> untranslated(const std::string& name, const Shape& local_shape);

// Each tensor `fsdp`'s optimizer steps, keyed by its TensorImpl, with its pieces. `name_of`
// names each of the wrapped module's parameters (FlatParameter::params()) as the checkpoint
// should (the model's fully-qualified name). `write`: whether this rank saves them (HSDP's
// first replica). Either layout; not collective.
ParamPieces fsdp_param_pieces(const fsdp::FullyShardedDataParallel& fsdp,
                              const std::function<std::string(const Tensor&)>& name_of, const GlobalOf& global_of,
                              bool write);

}  // namespace loom::distributed::checkpoint
