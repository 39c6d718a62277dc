// DTensor: a tensor laid out over one group of ranks, as torch.distributed.tensor.DTensor on
// a one-dimensional mesh: the local tensor this rank holds, the group (in a composed run, the
// tp dimension of the mesh), the placement (placement.h) and the logical (global) shape.
//
//   auto w = distribute_tensor(weight, tp, Shard(0));        // every rank passes the whole weight
//   Tensor mine = w.to_local();                              // this rank's rows
//   auto y = DTensor::from_local(partial_sum, tp, Partial());
//   Tensor out = redistribute(y, Replicate()).to_local();    // all_reduce forward, identity backward
//   Tensor full = w.full_tensor();                           // all_gather
//
// Every move is differentiable: gradients flow back through the conjugate collective, as
// Note [Gradient placements] (redistribute.h) works out. Every rank of the group must make
// the same calls in the same order: each one may be a collective.
//
// The sharp edge: a local gradient's placement is a convention, not something loom checks.
// A Replicate() tensor whose ranks each compute something different from it (a
// column-parallel layer's input) must be read with to_local(Partial()), or its gradient will
// be one rank's share only.
#pragma once

#include <memory>
#include <optional>

#include "core/tensor.h"                 // defines: Tensor
#include "parallel/comm/communicator.h"  // defines: Communicator
#include "parallel/tensor/placement.h"   // defines: Placement, Shard, Replicate, Partial

namespace loom::distributed {

class DTensor {
 public:
  // A DTensor made of this rank's `local` without communication. The global shape defaults
  // to PyTorch's guess: the local shape, times the group size along a Shard dim (even shards;
  // pass `shape` for uneven ones). The result shares `local`'s autograd history.
  static DTensor from_local(const Tensor& local, std::shared_ptr<Communicator> group, const Placement& placement,
                            std::optional<Shape> shape = std::nullopt);

  // This rank's tensor, carrying the DTensor's autograd history. With grad_placement, the
  // gradient that will reach the result is declared to have that placement rather than the
  // default of Note [Gradient placements], and the backward moves it there: Partial() on a
  // Replicate() DTensor all-reduces the gradient (Megatron's f).
  const Tensor& to_local() const { return local_; }
  Tensor to_local(const Placement& grad_placement) const;
  // The whole logical tensor on every rank: redistribute(Replicate()).to_local().
  Tensor full_tensor() const;
  // The same logical tensor placed `placement`; see redistribute.h for the moves.
  DTensor redistribute(const Placement& placement) const;

  const Placement& placement() const { return placement_; }
  const Shape& shape() const { return shape_; }  // the global shape
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  const std::shared_ptr<Communicator>& group() const { return group_; }
  bool requires_grad() const { return local_.requires_grad(); }

 private:
  DTensor(Tensor local, std::shared_ptr<Communicator> group, Placement placement, Shape shape);

  Tensor local_;
  std::shared_ptr<Communicator> group_;
  Placement placement_;
  Shape shape_;
};

// `tensor`, which every rank of `group` holds whole and alike, laid out as `placement`:
// Shard(d) keeps this rank's chunk (Note [Uneven shards]), Replicate() keeps it all. No
// communication. Differentiable: the gradient of the whole tensor is all-gathered from the
// shards' gradients, as the move Replicate() -> Shard(d). A Partial() DTensor is made with
// DTensor::from_local from each rank's summand.
DTensor distribute_tensor(const Tensor& tensor, std::shared_ptr<Communicator> group, const Placement& placement);

// dtensor.redistribute(placement).
DTensor redistribute(const DTensor& dtensor, const Placement& placement);

}  // namespace loom::distributed
