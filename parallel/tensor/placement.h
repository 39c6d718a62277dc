// Placement: how one mesh dimension (one Communicator group) holds a logical tensor, with
// the names of torch.distributed.tensor.
//
//   Shard(0)     each rank holds one chunk along dim 0, as torch.chunk cuts it
//   Replicate()  every rank holds the whole tensor
//   Partial()    every rank holds a tensor of the whole shape; the logical tensor is their sum
//
// A DTensor (dtensor.h) is a local tensor, a group and one of these. The mesh of a composed
// run ([pp, dp_replicate, dp_shard, tp], parallel_dims.h) gives tensor parallelism its group:
// the innermost dimension, tp.
//
// Note [Uneven shards]
// Shard(d) over a group of n ranks cuts dim d as torch.chunk(n) does: every rank gets
// ceil(size / n) rows, the last ones fewer, and a rank past the end gets none (size 2 over
// 3 ranks: 1, 1, 0; size 5 over 3 ranks: 2, 2, 1). torch.chunk would return fewer than n
// pieces there; DTensor gives the missing ranks an empty tensor, and so does loom. The
// collectives want equal pieces, so every shard travels padded to ceil(size / n) rows and
// is cut back on arrival (shard_range says where each rank's rows lie).
#pragma once

#include <cstdint>
#include <string>

#include "core/shape.h"  // defines: Shape

namespace loom::distributed {

struct Placement {
  enum class Kind { Shard, Replicate, Partial };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;  // Shard only: the dimension cut (negative counts from the end)

  bool is_shard() const { return kind == Kind::Shard; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool is_partial() const { return kind == Kind::Partial; }
  // "Shard(dim=0)", "Replicate()", "Partial(sum)": PyTorch's repr.
  std::string str() const;
  bool operator==(const Placement& other) const {
    return kind == other.kind && (kind != Kind::Shard || dim == other.dim);
  }
};

inline Placement Shard(int64_t dim = 0) { return {Placement::Kind::Shard, dim}; }
inline Placement Replicate() { return {Placement::Kind::Replicate, 0}; }
// Only the sum reduction: the one tensor parallelism's layers produce.
inline Placement Partial() { return {Placement::Kind::Partial, 0}; }

// Rows [offset, offset + length) of a dimension of `size` are rank `rank`'s of `world`;
// see Note [Uneven shards].
struct ShardRange {
  int64_t offset = 0;
  int64_t length = 0;
};
ShardRange shard_range(int64_t size, int world, int rank);
// ceil(size / world): the rows every shard is padded to when it travels.
int64_t shard_capacity(int64_t size, int world);

// `placement` with a negative Shard dim resolved against a tensor of `ndim` dimensions;
// an error naming both when the dim is out of range.
Placement normalized(const Placement& placement, int64_t ndim);

// The shape of rank `rank`'s local tensor for a logical tensor of `global_shape`.
Shape local_shape(const Shape& global_shape, const Placement& placement, int world, int rank);

}  // namespace loom::distributed
