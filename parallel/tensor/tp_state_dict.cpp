#include "parallel/tensor/tp_state_dict.h"

#include <sstream>  // defines: std::ostringstream

#include "autograd/grad_mode.h"            // defines: NoGradGuard
#include "core/error.h"                    // defines: LOOM_CHECK
#include "parallel/tensor/redistribute.h"  // defines: redistribute_local

namespace loom::distributed {

OrderedDict<Tensor> gather_tp_state(OrderedDict<Tensor> state, const StatePlacements& placements) {
  for (const auto& [name, spec] : placements) {
    Tensor* local = state.find(name);
    LOOM_CHECK(local != nullptr, "full_state_dict: '", name, "' was split by parallelize_module but is not in the "
               "state_dict; the placements belong to another model");
    *local = redistribute_local(*local, *spec.group, spec.shape, spec.placement, Replicate());
  }
  return state;
}

OrderedDict<Tensor> full_state_dict(const nn::Module& module, const StatePlacements& placements) {
  return gather_tp_state(module.state_dict(), placements);
}

void load_full_state_dict(nn::Module& module, const OrderedDict<Tensor>& state, const StatePlacements& placements) {
  OrderedDict<Tensor> mine;
  NoGradGuard no_grad;
  for (const auto& [name, whole] : state) {
    const DTensorSpec* spec = placements.find(name);
    if (spec == nullptr) {
      mine.insert(name, whole);
      continue;
    }
    LOOM_CHECK(whole.shape() == spec->shape, "load_full_state_dict: '", name, "' is split from a tensor of shape ",
               spec->shape, ", but the state_dict holds one of shape ", whole.shape());
    const ShardRange rows = shard_range(spec->shape[static_cast<size_t>(spec->placement.dim)], spec->group->size(),
                                        spec->group->rank());
    mine.insert(name, whole.narrow(spec->placement.dim, rows.offset, rows.length));
  }
  module.load_state_dict(mine);
}

std::string describe_placements(const StatePlacements& placements) {
  std::ostringstream out;
  for (const auto& [name, spec] : placements) out << name << " " << spec.placement.str() << " " << spec.shape << "\n";
  return out.str();
}

}  // namespace loom::distributed
