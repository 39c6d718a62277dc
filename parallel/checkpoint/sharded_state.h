// What one rank holds of a model's (or optimizer's) logical tensors, said so that a
// checkpoint can record it and another layout can read it back: torch.distributed.checkpoint's
// state_dict of DTensors / ShardedTensors, with boxes (chunks.h) as the one way to say
// where a local tensor's elements lie.
//
//   ShardedState mine;
//   mine.push_back(whole("fc.bias", fc_bias));                         // one process, DDP
//   mine.push_back(sharded("fc.weight", local_rows, {10, 512}, Shard(0), world, rank));
//   safetensors::File file = pack(mine);        // each piece under "fc.weight@0,0", with its box
//   // ... every rank writes its file (parallel/distributed_checkpoint.h) ...
//   // later, under any other layout: describe what this rank wants, then fill it
//   load(read_checkpoint_index(step_dir), wanted);                      (load_plan.h)
//
// Note [Saved pieces]
// A shard file holds each piece as its own tensor, named "<name>@<offsets>" (a rank may
// hold several boxes of one tensor: FSDP1's flat shards), and its metadata says, per
// piece, "dcp.<name>@<offsets>" -> "global=<shape>;offsets=<offsets>": the global shape
// and where the piece lies. Its own shape is the box's sizes. Nothing else is needed to
// read it back under another layout: no world size, no strategy, no unit layout.
// A replicated tensor (DDP's copies, TP's Replicate() parameters, BatchNorm's statistics
// on every rank) is written once: its LocalTensor says write = false on all but one of the
// ranks holding it (the layout knows which rank is the first replica). Should two files
// still hold the same box, the loader reads the first; boxes that overlap without being
// equal are refused (the layouts that wrote them disagree about the tensor).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"                   // defines: Tensor
#include "nn/safetensors.h"                // defines: safetensors::File
#include "parallel/checkpoint/chunks.h"    // defines: Chunk
#include "parallel/tensor/placement.h"     // defines: Placement

namespace loom::distributed::checkpoint {

// One box of the logical tensor `name`, stored contiguously (row-major over the box) in a
// local tensor from element `local_offset` on.
struct Piece {
  std::string name;
  Shape global_shape;
  Chunk chunk;
  int64_t local_offset = 0;
};

// A tensor this rank holds (a parameter, a buffer, an optimizer state) and the pieces of
// logical tensors it stores. `tensor` must be contiguous. With write = false the pieces
// are another rank's to save (a replica's); loading fills them all the same.
struct LocalTensor {
  Tensor tensor;
  std::vector<Piece> pieces;
  bool write = true;
};
using ShardedState = std::vector<LocalTensor>;

// The whole of `tensor`, under `name` (one process, DDP, a replica).
LocalTensor whole(const std::string& name, const Tensor& tensor, bool write = true);

// This rank's part of a tensor of `global_shape` laid out as `placement` over `world`
// ranks: Shard(d) is rows shard_range(...) of dim d (Note [Uneven shards]); `local` may
// hold more rows than that (FSDP2 pads each shard to the same size): the extra are not
// saved. Replicate() is whole(), written by rank 0 only. Partial() is a loom::Error.
LocalTensor sharded(const std::string& name, const Tensor& local, const Shape& global_shape,
                    const Placement& placement, int world, int rank);

// `chunk` of a tensor cut once more, as `placement` over `world` ranks cuts a tensor of
// the chunk's sizes: Shard(d) keeps rank `rank`'s rows of dim d (Note [Uneven shards]),
// Replicate() keeps it all. Partial() is a loom::Error (its pieces are summands, not parts).
Chunk cut(const Chunk& chunk, const Placement& placement, int world, int rank);

// Two cuts, the first applied to the global tensor and the second to what it left
// (FSDP2 x TP: TP's Shard(d) over tp first, then fully_shard's Shard(0) over dp_shard of
// the TP-local tensor). `local` is the second cut's piece, as sharded() takes it.
LocalTensor sharded_2d(const std::string& name, const Tensor& local, const Shape& global_shape,
                       const Placement& first, int first_world, int first_rank,
                       const Placement& second, int second_world, int second_rank);

// The pieces of `pieces` renamed by `rename` and laid onto another local tensor of the
// same numel (an optimizer state beside its parameter: "fc.weight" -> "optim.fc.weight.momentum_buffer").
template <typename Rename>
LocalTensor like(const LocalTensor& param, const Tensor& state, Rename&& rename) {
  LocalTensor out{state, param.pieces, param.write};
  for (Piece& p : out.pieces) p.name = rename(p.name);
  return out;
}

// "fc.weight@2,0": a saved piece's tensor name in its file (Note [Saved pieces]).
std::string piece_key(const Piece& piece);

// The pieces of `state` that this rank writes, as tensors (copies, contiguous) and their
// boxes as metadata (Note [Saved pieces]); `metadata` is added unchanged.
safetensors::File pack(const ShardedState& state, const safetensors::Metadata& metadata = {});

// The element view of `piece` inside `local.tensor`: a tensor of the box's sizes sharing
// its storage (what pack copies out, and what loading copies into).
Tensor piece_view(const LocalTensor& local, const Piece& piece);

}  // namespace loom::distributed::checkpoint
