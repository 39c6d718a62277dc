// The collectives that move a DTensor's local tensor from one placement to another, without
// autograd: dtensor.cpp runs them forward and, for the gradient, back (Note [Gradient
// placements]).
//
//   from          to            what moves                         its backward
//   Shard(d)      Replicate()   all_gather                         local chunk
//   Partial()     Replicate()   all_reduce (sum)                   nothing (identity)
//   Partial()     Shard(d)      reduce_scatter (sum)               all_gather
//   Replicate()   Shard(d)      nothing: each rank keeps its chunk all_gather
//
// Note [Gradient placements]
// loom's autograd moves plain local tensors, so the placement of a local gradient is a
// convention, PyTorch's: the gradient of a Shard(d) tensor is Shard(d) (each rank holds the
// gradient of its own rows) and the gradient of a Replicate() tensor is Replicate() (each
// rank holds the whole gradient of the one loss, which every rank computes alike from the
// replicated values, as the layers after an all-reduce do in Megatron). The gradient of a
// Partial() tensor is Replicate(): every summand of a sum gets the whole gradient of the sum.
// The backward of a move src -> dst is then the move of the gradient from
// gradient_placement(dst) to gradient_placement(src): the table's last column. The forward
// all_reduce of Partial -> Replicate with its identity backward is Megatron's g.
//
// Where the convention does not hold, the caller says so: a Replicate() tensor whose ranks
// compute different things from it (the input of a column-parallel layer: each rank
// multiplies it by its own columns of the weight) has a gradient that is only a partial sum
// on each rank. DTensor::to_local(grad_placement = Partial()) declares that, and its
// backward all-reduces the gradient into the Replicate() one: identity forward, all_reduce
// backward, Megatron's f. The same moves serve: the backward of to_local(g) on a tensor
// placed p is the move gradient_placement(p) <- g.
#pragma once

#include "core/tensor.h"                  // defines: Tensor
#include "parallel/comm/communicator.h"   // defines: Communicator
#include "parallel/tensor/placement.h"    // defines: Placement, Shard, Replicate, Partial

namespace loom::distributed {

// Rank group.rank()'s local tensor of a logical tensor of `global_shape`, moved from placement
// `from` to `to`. A collective: every rank of the group calls it with the same shape and
// placements. The moves of the table above (and from == to, which returns `local`); any
// other is an error naming the supported ones. No autograd: the result is a new tensor
// that requires no gradient (except from == to).
Tensor redistribute_local(const Tensor& local, Communicator& group, const Shape& global_shape, const Placement& from,
                          const Placement& to);

// See Note [Gradient placements].
inline Placement gradient_placement(const Placement& p) { return p.is_partial() ? Replicate() : p; }

}  // namespace loom::distributed
