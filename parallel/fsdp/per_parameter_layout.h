// The per-parameter layout of an FSDP unit: every parameter cut on dim 0, as PyTorch's
// FSDP2 (fully_shard) cuts each parameter into a DTensor Shard(0), instead of the flat
// buffer cut into N equal slices (flat_param.h). fully_shard.h is the user's side of it.
//
// Note [Per-parameter shards]
// Parameter i of shape [d0, rest...] (a 0-d parameter counts as [1]) has rows of
// row_numel = prod(rest) elements. Over N ranks it is cut as torch.chunk cuts it (Note
// [Uneven shards], parallel/tensor/placement.h): chunk_rows = ceil(d0 / N) rows each, the
// last ranks fewer, a rank past the end none. Rank r's shard is its piece of every
// parameter, one after the other, each piece padded with zeros to chunk_rows rows:
//
//   unit params    w [10, 4] (40)           b [10]            g [2]        N = 3
//   chunk rows     4 (16 elements)          4                 1
//   rank 0 shard   [ w rows 0-3 ......... | b 0-3 ......... | g 0   ]   21 elements
//   rank 1 shard   [ w rows 4-7 ......... | b 4-7 ......... | g 1   ]   21
//   rank 2 shard   [ w rows 8-9 | pad 8   | b 8-9 | pad 2   | pad 1 ]   21
//
// Every rank's shard has the same size, sum_i chunk_rows_i * row_numel_i, so the unit
// still moves as one buffer with one collective, as the flat layout does:
// - gather: all_gather the shards into a rank-major buffer [shard 0 | shard 1 | shard 2],
//   then copy each piece to its parameter's place in the unsharded, parameter-major
//   buffer (w's 40 values, b's 10, g's 2: the flat layout's full buffer, which the
//   module's parameters view);
// - reduce: copy each gradient's rows (divided by the world) into the rank-major order,
//   padding zero, and reduce_scatter it: rank r receives the summed gradient laid out
//   as its shard.
// Bytes per collective: N * shard_size, the flat layout's padded size up to the
// padding of each parameter (at most N - 1 rows of each; 63 against 54 above, a few
// elements per parameter in a ResNet's units). What the cut buys: each piece of a shard
// is one parameter's rows, a tensor of its own (a local shard shaped [rows, rest...]),
// so the optimizer, its parameter groups and clipping see ordinary per-parameter tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"                // defines: Tensor, Shape
#include "parallel/tensor/placement.h"  // defines: ShardRange, shard_range

namespace loom::fsdp {

// Where one parameter lies: in the unsharded buffer, and in every rank's shard.
struct ParameterPiece {
  int64_t rows = 0;         // dim 0 of the parameter (1 for a 0-d parameter)
  int64_t row_numel = 0;    // elements per row: the product of the other dims
  int64_t chunk_rows = 0;   // ceil(rows / N): the rows each rank's piece has room for
  int64_t offset = 0;       // where the piece starts in a shard
  int64_t full_offset = 0;  // where the parameter starts in the unsharded buffer
  int64_t numel() const { return chunk_rows * row_numel; }  // the piece, padding included
};

// A pure function of the shapes, so that every rank computes the same layout.
struct PerParameterLayout {
  std::vector<ParameterPiece> pieces;
  int group_size = 1;
  int64_t total = 0;       // the parameters' numels summed: the unsharded buffer
  int64_t shard_size = 0;  // the pieces' numels summed: every rank's shard

  // The rows of parameter i that rank `rank` holds (torch.chunk's cut).
  distributed::ShardRange rows_of(size_t i, int rank) const;
  // Where rank `rank`'s piece of parameter i starts in a rank-major buffer of every
  // rank's shard (what all_gather fills and reduce_scatter reads).
  int64_t slot(size_t i, int rank) const { return rank * shard_size + pieces[i].offset; }
  // The shape of rank `rank`'s local shard of parameter i (of shape `shape`):
  // [its rows, rest...]; [its rows] for a 0-d parameter.
  Shape local_shape(size_t i, const Shape& shape, int rank) const;
};
PerParameterLayout per_parameter_layout(const std::vector<Shape>& shapes, int group_size);

// shard ([shard_size]) <- rank `rank`'s rows of every parameter, from `full` (the
// unsharded buffer, at least [total]), padding zero.
void pack_shard(const PerParameterLayout& layout, const Tensor& full, int rank, const Tensor& shard);
// full ([total]) <- every rank's rows, from `gathered` ([group_size * shard_size],
// rank-major, as all_gather fills it).
void unpack_shards(const PerParameterLayout& layout, const Tensor& gathered, const Tensor& full);

}  // namespace loom::fsdp
