#include "nn/optim/optimizer.h"

#include <set>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/copy.h"
#include "core/factory.h"

namespace loom::optim {
namespace {

std::string known_keys(const std::map<std::string, double>& options) {
  std::string keys;
  for (const auto& [k, v] : options) keys += (keys.empty() ? "" : ", ") + k;
  return keys;
}

}  // namespace

double& ParamGroup::operator[](const std::string& key) {
  auto found = options.find(key);
  LOOM_CHECK(found != options.end(), "param group has no option \"", key, "\" (it has: ", known_keys(options), ")");
  return found->second;
}

double ParamGroup::operator[](const std::string& key) const { return const_cast<ParamGroup&>(*this)[key]; }

Optimizer::Optimizer(std::vector<ParamGroup> groups, std::map<std::string, double> defaults, std::string name)
    : defaults_(std::move(defaults)), name_(std::move(name)) {
  size_t total = 0;
  for (const ParamGroup& g : groups) total += g.params.size();
  LOOM_CHECK(total > 0, name_, ": optimizer got an empty parameter list");
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  for (const auto& [key, value] : group.options)
    LOOM_CHECK(defaults_.count(key), name_, ": unknown hyperparameter \"", key, "\" in a param group (", name_,
               " knows: ", known_keys(defaults_), ")");
  for (const auto& [key, value] : defaults_) group.options.emplace(key, value);  // keeps the group's own
  std::set<const TensorImpl*> seen;
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) seen.insert(p.unsafe_impl());
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    LOOM_CHECK(p.defined(), name_, ": parameter ", i, " of the new group is undefined");
    LOOM_CHECK(p.is_leaf(), name_, ": can't optimize a non-leaf tensor (parameter ", i, ", produced by ",
               p.grad_fn() ? p.grad_fn()->name() : "?", ")");
    LOOM_CHECK(seen.insert(p.unsafe_impl()).second, name_, ": parameter ", i, " of the new group already appears "
               "in this optimizer (a parameter can be in one group only)");
  }
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (ParamGroup& g : groups_) {
    for (const Tensor& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) p.set_grad(Tensor());
      else grad.zero_();
    }
  }
}

std::vector<Tensor> Optimizer::state_tensors() const {
  std::vector<Tensor> out;
  for (const auto& [param, entries] : state_)
    for (const auto& [name, t] : entries) out.push_back(t);
  return out;
}

OrderedDict<Tensor> Optimizer::state_dict() const {
  OrderedDict<Tensor> out;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    for (const auto& [key, value] : groups_[g].options) out.insert(prefix + key, scalar_tensor(value, kFloat64));
    std::vector<int64_t> indices;
    for (const Tensor& p : groups_[g].params) {
      auto found = state_.find(p.unsafe_impl());
      if (found != state_.end()) {
        for (const auto& [name, t] : found->second)
          out.insert("state." + std::to_string(index) + "." + name, t.detach());
      }
      indices.push_back(index++);
    }
    out.insert(prefix + "params", from_vector(indices, {static_cast<int64_t>(indices.size())}));
  }
  return out;
}

void Optimizer::load_state_dict(const OrderedDict<Tensor>& state) {
  // Check the shape of the whole thing first so a mismatched checkpoint changes nothing.
  int64_t index = 0;
  std::vector<std::pair<const Tensor*, std::string>> params;  // (parameter, "state.<i>.") in order
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    const Tensor* ids = state.find(prefix + "params");
    LOOM_CHECK(ids, name_, ".load_state_dict: the state has no \"", prefix, "params\"; it was saved from an optimizer "
               "with fewer param groups than this one's ", groups_.size());
    LOOM_CHECK(ids->numel() == static_cast<int64_t>(groups_[g].params.size()), name_, ".load_state_dict: param group ",
               g, " has ", groups_[g].params.size(), " parameters but the saved group had ", ids->numel());
    for (const auto& [key, value] : defaults_)
      LOOM_CHECK(state.contains(prefix + key), name_, ".load_state_dict: the state has no \"", prefix, key, "\"");
    for (const Tensor& p : groups_[g].params) params.emplace_back(&p, "state." + std::to_string(index++) + ".");
  }
  LOOM_CHECK(!state.contains("param_groups." + std::to_string(groups_.size()) + ".params"), name_,
             ".load_state_dict: the state has more param groups than this optimizer's ", groups_.size());
  for (const auto& [param, prefix] : params) {
    for (const auto& [key, t] : state) {
      if (key.rfind(prefix, 0) != 0) continue;
      LOOM_CHECK(t.shape() == param->shape() || t.dim() == 0, name_, ".load_state_dict: \"", key, "\" has shape ",
                 t.shape(), " but its parameter has shape ", param->shape(), " (or a scalar, as Adam's step)");
    }
  }

  NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    // Every hyperparameter the saved group had, including ones a scheduler added
    // ("initial_lr"), as PyTorch restores the whole group dict.
    for (const auto& [key, t] : state) {
      if (key.rfind(prefix, 0) != 0 || key == prefix + "params") continue;
      groups_[g].options[key.substr(prefix.size())] = t.to(kFloat64).item<double>();
    }
  }
  state_.clear();
  for (const auto& [param, prefix] : params) {
    for (const auto& [key, t] : state) {
      if (key.rfind(prefix, 0) != 0) continue;
      // A copy on the parameter's device and dtype, as PyTorch casts loaded state, except a
      // scalar (Adam's step), which PyTorch keeps as saved, on the CPU.
      const bool scalar = t.dim() == 0 && param->dim() != 0;
      Tensor copy = scalar ? empty({}, TensorOptions(t.dtype()))
                           : empty(param->shape(), TensorOptions(param->dtype()).device(param->device()));
      copy_into(copy, t);
      state_[param->unsafe_impl()].insert(key.substr(prefix.size()), copy);
    }
  }
}

}  // namespace loom::optim
