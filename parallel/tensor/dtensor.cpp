#include "parallel/tensor/dtensor.h"

#include <utility>

#include "autograd/variable.h"             // defines: record, any_requires_grad
#include "core/error.h"                    // defines: LOOM_CHECK
#include "parallel/tensor/redistribute.h"  // defines: redistribute_local, gradient_placement

namespace loom::distributed {
namespace {

// `local` moved from -> to, recorded so that its gradient moves grad_to -> grad_from.
// See Note [Gradient placements]. The backward keeps the group alive and saves no tensor,
// so the graph may be back-propagated through it again (Note [Nodes that save nothing]).
Tensor move(const Tensor& local, const std::shared_ptr<Communicator>& group, const Shape& global_shape,
            const Placement& from, const Placement& to, const Placement& grad_from, const Placement& grad_to,
            const char* name) {
  Tensor out = redistribute_local(local, *group, global_shape, from, to);
  if (from == to && grad_from == grad_to) return out;
  // A tensor of its own for the gradient's move alone: an alias (detach() shares the
  // storage), not a copy, so Megatron's f costs no memory. Nothing writes into either.
  if (from == to) out = out.detach();
  if (!any_requires_grad({local})) return out;
  record(
      name, {local}, {out},
      [group, global_shape, grad_from, grad_to](const std::vector<Tensor>& grads) {
        return std::vector<Tensor>{redistribute_local(grads[0], *group, global_shape, grad_to, grad_from)};
      },
      /*saves_tensors=*/false);
  return out;
}

}  // namespace

DTensor::DTensor(Tensor local, std::shared_ptr<Communicator> group, Placement placement, Shape shape)
    : local_(std::move(local)), group_(std::move(group)), placement_(placement), shape_(std::move(shape)) {}

DTensor DTensor::from_local(const Tensor& local, std::shared_ptr<Communicator> group, const Placement& placement,
                            std::optional<Shape> shape) {
  LOOM_CHECK(group != nullptr, "DTensor::from_local: the group (communicator) is null");
  LOOM_CHECK(local.defined(), "DTensor::from_local: the local tensor is undefined");
  const Placement p = normalized(placement, local.dim());
  Shape global = shape ? *shape : local.shape();
  if (!shape && p.is_shard()) global[static_cast<size_t>(p.dim)] *= group->size();
  const Shape expected = local_shape(global, p, group->size(), group->rank());
  LOOM_CHECK(local.shape() == expected, "DTensor::from_local: a global shape ", global, " placed ", p.str(),
             " gives rank ", group->rank(), " of ", group->size(), " a local shape ", expected, ", but the local "
             "tensor has shape ", local.shape(), "; pass the global shape for uneven shards");
  return DTensor(local, std::move(group), p, std::move(global));
}

Tensor DTensor::to_local(const Placement& grad_placement) const {
  const Placement declared = normalized(grad_placement, dim());
  return move(local_, group_, shape_, placement_, placement_, gradient_placement(placement_), declared,
              "ToLocalBackward");
}

DTensor DTensor::redistribute(const Placement& placement) const {
  const Placement to = normalized(placement, dim());
  Tensor out = move(local_, group_, shape_, placement_, to, gradient_placement(placement_), gradient_placement(to),
                    "RedistributeBackward");
  return DTensor(std::move(out), group_, to, shape_);
}

Tensor DTensor::full_tensor() const { return redistribute(Replicate()).to_local(); }

DTensor distribute_tensor(const Tensor& tensor, std::shared_ptr<Communicator> group, const Placement& placement) {
  LOOM_CHECK(!placement.is_partial(), "distribute_tensor: a whole tensor cannot be distributed as ", placement.str(),
             "; make a Partial() DTensor with DTensor::from_local from each rank's summand");
  return DTensor::from_local(tensor, std::move(group), Replicate()).redistribute(placement);
}

DTensor redistribute(const DTensor& dtensor, const Placement& placement) { return dtensor.redistribute(placement); }

}  // namespace loom::distributed
