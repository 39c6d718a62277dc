#include "parallel/comm/host_staging.h"

#include "core/copy.h"     // defines: copy_into
#include "core/error.h"
#include "core/factory.h"  // defines: empty

namespace loom::distributed {

namespace {

enum class Role { Input, Output, InOut };

// What the operation does with op.tensor and with op.list (see Op in op.h).
std::pair<Role, Role> roles(OpKind kind) {
  switch (kind) {
    case OpKind::AllReduce:
    case OpKind::Broadcast: return {Role::InOut, Role::Input};
    case OpKind::AllGather: return {Role::Input, Role::Output};
    case OpKind::ReduceScatter: return {Role::Output, Role::Input};
    case OpKind::Send: return {Role::Input, Role::Input};
    case OpKind::Recv: return {Role::Output, Role::Input};
    case OpKind::Barrier: return {Role::Input, Role::Input};
  }
  LOOM_FAIL("host staging: unknown operation kind ", static_cast<int>(kind));
}

Tensor stand_in(const Tensor& t, Role role, Device host, HostStaged& staged) {
  if (!t.defined()) return t;
  Tensor h = role == Role::Output ? empty(t.shape(), TensorOptions(t.dtype()).device(host))
                                  : t.to(host, /*non_blocking=*/false).contiguous();
  if (h.is_same(t)) h = t.clone();  // already on `host`: still a stand-in of its own
  if (role != Role::Input) staged.results.emplace_back(t, h);
  return h;
}

}  // namespace

bool needs_host_staging(const Op& op) {
  if (op.tensor.defined() && op.tensor.device().is_cuda()) return true;
  for (const Tensor& t : op.list)
    if (t.device().is_cuda()) return true;
  return false;
}

HostStaged stage_on_host(const Op& op, Device host) {
  HostStaged staged{op, {}};
  const auto [tensor_role, list_role] = roles(op.kind);
  staged.op.tensor = stand_in(op.tensor, tensor_role, host, staged);
  for (size_t i = 0; i < op.list.size(); ++i) staged.op.list[i] = stand_in(op.list[i], list_role, host, staged);
  return staged;
}

void copy_results_back(const HostStaged& staged) {
  for (const auto& [caller, host] : staged.results) {
    Tensor out = caller;
    copy_into(out, host, /*non_blocking=*/false);
  }
}

}  // namespace loom::distributed
