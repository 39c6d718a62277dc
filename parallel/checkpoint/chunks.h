// Chunks: the boxes that a sharded checkpoint cuts its tensors into, and the arithmetic on
// them that resharding needs. PyTorch's torch.distributed.checkpoint calls one of these a
// ChunkStorageMetadata (offsets, sizes).
//
//   Chunk rows{.offsets = {2, 0}, .sizes = {2, 3}};          // rows 2..3 of a [5, 3] tensor
//   Chunk cols{.offsets = {0, 1}, .sizes = {5, 1}};          // column 1
//   intersect(rows, cols);                                   // {offsets {2, 1}, sizes {2, 1}}
//   chunks_of_flat_range({5, 3}, 4, 11);                     // FSDP1's flat slice as boxes:
//       // {1,1}+{1,2}  (the end of row 1), {2,0}+{1,3} (row 2), {3,0}+{1,2} (the start of row 3)
//
// Note [Every layout is a set of boxes]
// Every way loom holds a tensor over ranks gives each rank some boxes of it, each stored
// contiguously (row-major over the box) somewhere in a local tensor:
//   one process, DDP, ZeRO-1's model    the whole tensor: one box
//   FSDP2 (Shard(0)), TP (Shard(d))     one box cut along d (Note [Uneven shards])
//   FSDP2 x TP (Shard(0), Shard(d))     one box cut along both
//   FSDP1's flat shards                 a range of the flattened tensor, which is at most
//                                       2 * ndim - 1 boxes (chunks_of_flat_range)
//   a pipeline stage                    whole boxes of its own stage's tensors only
// So a checkpoint that records, for every stored piece, the logical tensor's name, its
// global shape and the piece's box can be read back under any other layout: a rank wants
// its own boxes, and each is filled from the saved boxes that overlap it (load_plan.h).
// That is the resharding of torch.distributed.checkpoint, with boxes as its only currency.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/shape.h"  // defines: Shape

namespace loom::distributed::checkpoint {

// The elements i of a tensor with offsets[d] <= i[d] < offsets[d] + sizes[d] in every
// dimension d. A 0-d tensor's one chunk has no dimensions (and one element).
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;

  int64_t numel() const;
  // "[2:4, 0:3]"
  std::string str() const;
  bool operator==(const Chunk& other) const { return offsets == other.offsets && sizes == other.sizes; }
};

// The whole of a tensor of `shape`.
Chunk whole_chunk(const Shape& shape);

// The overlap of two chunks of one tensor, or nullopt when they share no element.
std::optional<Chunk> intersect(const Chunk& a, const Chunk& b);

// `inner` re-expressed relative to `outer`'s corner (inner must lie within outer).
Chunk relative_to(const Chunk& inner, const Chunk& outer);

// A loom::Error naming `what` unless `chunk` lies within a tensor of `shape`.
void check_within(const Chunk& chunk, const Shape& shape, const std::string& what);

// Elements [begin, end) of a tensor of `shape` flattened row-major, as the fewest boxes
// whose row-major orders, one after another, are that range: at most 2 * ndim - 1 of them.
// See Note [Every layout is a set of boxes].
std::vector<Chunk> chunks_of_flat_range(const Shape& shape, int64_t begin, int64_t end);

}  // namespace loom::distributed::checkpoint
