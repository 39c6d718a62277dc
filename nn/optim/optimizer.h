// Optimizer: what every optimizer shares, as torch.optim.Optimizer: parameter groups with
// their hyperparameters, zero_grad, and a state_dict for exact resumption.
//
//   optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
//   for (auto& [x, y] : loader) {
//     opt.zero_grad();
//     criterion(model->forward(x), y).backward();
//     opt.step();
//   }
//   opt.param_groups()[0]["lr"] = 0.01;   // what LR schedulers do
//
// A ParamGroup is PyTorch's group dict: the parameters plus named hyperparameters
// ("lr", "momentum", ...). Groups let parts of a model train differently (no weight
// decay on BatchNorm, a smaller lr for a pretrained backbone).
//
// Note [Flat optimizer state]
// state_dict() returns name -> tensor, the same shape of thing as a module's state_dict,
// so one safetensors file can hold a whole checkpoint (model, optimizer, scheduler):
//   "param_groups.<g>.<hyperparameter>"  float64 scalar (bools as 0/1)
//   "param_groups.<g>.params"            int64 [n]: the indices of the group's parameters
//   "state.<i>.<name>"                   per-parameter state (SGD: momentum_buffer; AdamW:
//                                        step, a 0-d tensor, exp_avg, exp_avg_sq)
// Parameters are numbered across groups in order, as PyTorch's optimizer state_dict
// numbers them. Per-parameter state that does not exist yet (no step taken) is absent.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/ordered_dict.h"

namespace loom::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  std::map<std::string, double> options;  // "lr", "momentum", ... (missing ones take the defaults)

  // options[key]; a loom::Error naming the known keys if absent.
  double& operator[](const std::string& key);
  double operator[](const std::string& key) const;
  bool has(const std::string& key) const { return options.count(key) != 0; }
};

class Optimizer {
 public:
  Optimizer(std::vector<ParamGroup> groups, std::map<std::string, double> defaults, std::string name);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient; runs under NoGradGuard.
  virtual void step() = 0;
  // set_to_none=true drops gradients; false fills them with zeros (as Module::zero_grad).
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Adds a group; missing hyperparameters take the optimizer's defaults. (The
  // constructor calls this class's own, whatever a subclass overrides.)
  virtual void add_param_group(ParamGroup group);
  const std::string& name() const { return name_; }
  // The hyperparameters a group gets when it does not set them (PyTorch's optimizer.defaults).
  const std::map<std::string, double>& defaults() const { return defaults_; }

  // See Note [Flat optimizer state]. Virtual because a wrapper that shards the state
  // (parallel/zero_redundancy_optimizer.h) must gather it before it can write it.
  virtual OrderedDict<Tensor> state_dict() const;
  // Restores hyperparameters and per-parameter state; the groups must have the same
  // sizes as when saved (a loom::Error says which group differs).
  virtual void load_state_dict(const OrderedDict<Tensor>& state);
  // Every per-parameter state tensor this optimizer holds in this process (SGD: the
  // momentum buffers), for memory accounting (nn/model_state.h).
  virtual std::vector<Tensor> state_tensors() const;

 protected:
  // Per-parameter state, keyed by the parameter's TensorImpl (parameters keep their
  // identity across Module::to; see Note [Parameters keep their identity]).
  std::map<const TensorImpl*, OrderedDict<Tensor>> state_;

 private:
  std::vector<ParamGroup> groups_;
  std::map<std::string, double> defaults_;
  std::string name_;
};

}  // namespace loom::optim
