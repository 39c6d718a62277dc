// nn::Module: the base of every layer and model, as torch.nn.Module.
//
//   class Net : public nn::Cloneable<Net> {
//    public:
//     Net() : Cloneable("Net") { reset(); }
//     void reset() override {                       // the constructor's body; see Cloneable
//       fc1 = register_module("fc1", std::make_shared<nn::Linear>(784, 128));
//       fc2 = register_module("fc2", std::make_shared<nn::Linear>(128, 10));
//     }
//     Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
//     std::shared_ptr<nn::Linear> fc1, fc2;
//   };
//   auto net = std::make_shared<Net>();
//   net->named_parameters();   // "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"
//   net->to(Device("cuda:0")); // moves every parameter and buffer in place
//
// A module owns three ordered registries: parameters (leaf tensors that require grad),
// buffers (state that is not trained: BatchNorm's running statistics) and children
// (sub-modules). Dotted names ("layer1.0.conv1.weight") come from walking children
// depth-first in registration order, exactly as PyTorch's. Modules are held by
// std::shared_ptr; a member like `fc1` above is a second handle to the registered child.
//
// Note [Parameters keep their identity]
// A parameter is a Tensor handle (shared TensorImpl). Optimizers, DDP hooks and user code
// keep handles to parameters, so operations that change a parameter's data, such as
// to(device), to(dtype) and clone()'s state copy, swap the data *inside* the TensorImpl
// (storage, dtype, strides) rather than registering a new tensor, as PyTorch's
// `param.data = ...`. Every handle then sees the moved data, and the tensor stays a leaf
// that requires grad. Its gradient, if any, is moved along.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/init.h"
#include "nn/ordered_dict.h"

namespace loom::nn {

class Sequential;  // nn/container.h

// Replaces the data behind `self` (storage, shape, strides, offset, dtype) with `data`'s,
// keeping the TensorImpl, and so every handle, requires_grad and hooks: PyTorch's
// `param.data = data`. See Note [Parameters keep their identity].
void set_data(const Tensor& self, const Tensor& data);

// A leaf that requires grad sharing `data`'s storage (torch.nn.Parameter(data)).
Tensor Parameter(const Tensor& data, bool requires_grad = true);

// What load_state_dict found when strict=false (strict=true throws instead).
struct LoadResult {
  std::vector<std::string> missing_keys;     // in the module, absent from the dict
  std::vector<std::string> unexpected_keys;  // in the dict, not in the module
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module& operator=(const Module&) = delete;

  // The computation; layers override it. module(x) (operator()) runs it between the
  // forward hooks below, as PyTorch's __call__; a parent calls its children that way.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input);

  // ---- forward hooks (torch.nn.Module.register_forward_pre_hook / register_forward_hook):
  // a pre-hook returns the input forward will get, a hook the output module(x) returns.
  // They run, in registration order, only when the module is called as module(x); see
  // Note [Forward hooks run in module(x)]. clone() copies them, as deepcopy does.
  using ForwardPreHook = std::function<Tensor(Module& module, const Tensor& input)>;
  using ForwardHook = std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;
  void register_forward_pre_hook(ForwardPreHook hook);
  void register_forward_hook(ForwardHook hook);
  bool has_forward_hooks() const { return !forward_pre_hooks_.empty() || !forward_hooks_.empty(); }
  // module(x) runs forward under nn::checkpoint (its hooks outside): Note [Activation
  // checkpointing], nn/checkpoint.h; set by nn::apply_activation_checkpointing.
  void set_activation_checkpointing(bool on) { activation_checkpointing_ = on; }
  bool activation_checkpointing() const { return activation_checkpointing_; }
  const std::string& type_name() const { return type_name_; }

  // ---- registration: names must be non-empty, contain no '.', and be unique across the
  // three registries; registering an existing name of the same kind replaces it. An
  // undefined tensor registers a slot that iteration skips (Conv2d(bias=false)'s bias).
  Tensor& register_parameter(const std::string& name, const Tensor& tensor, bool requires_grad = true);
  // Non-persistent buffers move with to() but are left out of state_dict().
  Tensor& register_buffer(const std::string& name, const Tensor& tensor, bool persistent = true);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    LOOM_CHECK(module, type_name_, ".register_module(\"", name, "\"): the module is null");
    check_not_ancestor(name, *module);
    check_new_name(name, Kind::Module);
    children_.insert(name, module);
    return module;
  }

  // ---- traversal (depth-first, registration order, dotted names) ----------------------
  // named_parameters skips a parameter it has already yielded under another name (a
  // shared weight), as PyTorch's remove_duplicate=True; state_dict() does not.
  OrderedDict<Tensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  OrderedDict<Tensor> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  OrderedDict<std::shared_ptr<Module>> named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const { return children_.values(); }
  // This module (name "") and all descendants; needs this module to be owned by a
  // shared_ptr (std::make_shared), as every loom module is.
  OrderedDict<std::shared_ptr<Module>> named_modules(const std::string& prefix = "");
  std::vector<std::shared_ptr<Module>> modules() { return named_modules().values(); }

  // ---- modes and movement -----------------------------------------------------------
  // Sets training mode on this module and every descendant (affects BatchNorm, Dropout).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // In place; see Note [Parameters keep their identity]. to(dtype) converts floating
  // parameters and buffers only (num_batches_tracked stays int64), as PyTorch.
  void to(Device device, bool non_blocking = false);
  void to(DType dtype);
  // set_to_none=true drops gradients (the next backward allocates fresh ones); false
  // fills them with zeros.
  void zero_grad(bool set_to_none = true);
  // fn on every descendant, then on this module (torch.nn.Module.apply).
  void apply(const std::function<void(Module&)>& fn);

  // ---- state (nn/state_dict.cpp) --------------------------------------------------------
  // Parameters then buffers of each module, depth-first: torchvision's key order. Values
  // are detached tensors sharing the module's storage.
  OrderedDict<Tensor> state_dict() const;
  // Copies values in place (under NoGradGuard). Shape or dtype mismatches are always
  // errors, listing every mismatch; missing/unexpected keys are errors when strict.
  LoadResult load_state_dict(const OrderedDict<Tensor>& state_dict, bool strict = true);

  // ---- copies ------------------------------------------------------------------------
  // A deep copy: same structure and training flags, new tensors holding copies of every
  // parameter and buffer (on `device` when given, else where the source's live). The copy
  // shares nothing with this module, and gradients are not copied.
  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const;
  // The structure half of clone(): a module of the same type and configuration whose
  // tensors have the right shapes but uninitialised values. Cloneable<T> implements it
  // for leaf layers and models; containers (Sequential) override it.
  virtual std::shared_ptr<Module> clone_structure() const;

  // ---- the layers in forward order, as a Sequential sharing this module's modules (and so
  // its parameters): what pipelines cut into stages and FSDP wraps unit by unit. Null here:
  // a model offers one by overriding it (ResNet, VisionTransformer; a Sequential is its own).
  // Its state_dict keys are positional ("0.weight"): checkpoint through the model itself.
  virtual std::shared_ptr<Sequential> sequential() const { return nullptr; }

  // ---- printing: "ResNet(\n  (conv1): Conv2d(3, 64, kernel_size=(3, 3), ...)\n ...)".
  virtual std::string extra_repr() const { return ""; }
  std::string str() const;

 protected:
  Module(const Module&) = default;  // Cloneable copies configuration, then re-registers
  void clear_registrations();

  OrderedDict<Tensor> parameters_;
  OrderedDict<Tensor> buffers_;
  OrderedDict<std::shared_ptr<Module>> children_;
  std::set<std::string> non_persistent_buffers_;
  bool training_ = true;

  // For a layer whose forward must not run without its hooks (a tensor-parallel layer's
  // hooks move its input and output between placements): an error when this module has
  // hooks and forward was called directly rather than as module(x).
  void check_hooks_ran() const;

 private:
  enum class Kind { Parameter, Buffer, Module };
  void check_new_name(const std::string& name, Kind kind) const;
  // A child that is this module or has it below would make every traversal endless.
  void check_not_ancestor(const std::string& name, const Module& child) const;
  void collect(bool parameters, const std::string& prefix, bool recurse, bool dedupe,
               OrderedDict<Tensor>& out, std::set<const TensorImpl*>& seen) const;
  void state_dict_into(const std::string& prefix, OrderedDict<Tensor>& out) const;
  void copy_state_from(const Module& source, const std::optional<Device>& device);

  std::string type_name_;
  std::vector<ForwardPreHook> forward_pre_hooks_;
  std::vector<ForwardHook> forward_hooks_;
  bool activation_checkpointing_ = false;
  Tensor call_forward(const Tensor& input);  // forward(input), known to come through module(x)
};

// Note [Forward hooks run in module(x)]
// PyTorch runs hooks in Module.__call__, so `self.conv1(x)` runs them and
// `self.conv1.forward(x)` skips them. loom's operator() is that __call__, and loom's models
// call their children as (*conv1)(x) for the same reason. Skipping a tensor-parallel
// layer's hooks would compute with a shard as if it were the whole weight and give a
// wrong answer without an error, so such layers call check_hooks_ran() first: it knows,
// through a per-thread record of the module operator() is running, whether forward came
// from there.

// Note [Cloneable]
// Generic deep copy needs every handle a layer keeps (`weight`, `conv1`, ...) to point at
// the copy's tensors, and C++ cannot enumerate a class's members. So, as in libtorch, a
// layer puts the body of its constructor in reset(), which (re)creates its parameters,
// buffers and children and assigns its members. clone_structure() copy-constructs the
// layer (copying configuration such as in_features), forgets the copied registrations,
// and calls reset() under init::NoInitGuard (see Note [Skipping initialisation]);
// Module::clone() then copies the values by name. Rule for reset(): register everything
// the layer owns as *new* tensors (empty(...) then init), and assign each member handle
// from the register_* call. (clone() checks that no tensor is shared with the original.)
template <typename Derived>
class Cloneable : public Module {
 public:
  using Module::Module;
  virtual void reset() = 0;

  std::shared_ptr<Module> clone_structure() const override {
    auto copy = std::make_shared<Derived>(static_cast<const Derived&>(*this));
    copy->clear_registrations();
    init::NoInitGuard no_init;
    copy->reset();
    return copy;
  }
};

}  // namespace loom::nn
