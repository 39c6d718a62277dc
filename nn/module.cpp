#include "nn/module.h"

#include <sstream>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/copy.h"
#include "nn/checkpoint.h"  // defines: checkpoint (a module marked for activation checkpointing)

namespace loom::nn {
namespace {

// Applies `convert` to a registered tensor's data and to its gradient, in place.
void convert_in_place(const Tensor& t, const std::function<Tensor(const Tensor&)>& convert) {
  if (!t.defined()) return;
  Tensor grad = t.grad();
  set_data(t, convert(t.detach()));
  if (grad.defined()) t.set_grad(convert(grad));
}

// A copy of `src` on `device` that shares no memory with it.
Tensor fresh_copy(const Tensor& src, Device device) {
  Tensor out = empty(src.shape(), TensorOptions(src.dtype()).device(device));
  copy_into(out, src.detach());
  return out;
}

}  // namespace

void set_data(const Tensor& self, const Tensor& data) {
  TensorImpl& impl = *self.unsafe_impl();
  impl.storage = data.storage();
  impl.shape = data.shape();
  impl.strides = data.strides();
  impl.offset = data.storage_offset();
  impl.dtype = data.dtype();
}

Tensor Parameter(const Tensor& data, bool requires_grad) {
  LOOM_CHECK(data.defined(), "Parameter: the data tensor is undefined");
  Tensor p = data.detach();
  if (requires_grad) p.requires_grad_(true);
  return p;
}

Tensor Module::forward(const Tensor&) {
  LOOM_FAIL(type_name_, " does not implement forward(const Tensor&); override it, or call the module's own "
            "forward overload (a loss takes (input, target))");
}

// The module whose operator() this thread is running: Note [Forward hooks run in module(x)].
static thread_local const Module* calling_through_hooks = nullptr;

Tensor Module::operator()(const Tensor& input) {
  if (!has_forward_hooks() && !activation_checkpointing_) return forward(input);
  Tensor x = input;
  for (const auto& hook : forward_pre_hooks_) x = hook(*this, x);
  Tensor y = activation_checkpointing_
                 ? checkpoint([this](const Tensor& in) { return call_forward(in); }, x, this)  // Note [Activation checkpointing]
                 : call_forward(x);
  for (const auto& hook : forward_hooks_) y = hook(*this, x, y);
  return y;
}

Tensor Module::call_forward(const Tensor& input) {
  const Module* outer = calling_through_hooks;
  calling_through_hooks = this;
  Tensor y;
  try {
    y = forward(input);
  } catch (...) {
    calling_through_hooks = outer;
    throw;
  }
  calling_through_hooks = outer;
  return y;
}

void Module::register_forward_pre_hook(ForwardPreHook hook) {
  LOOM_CHECK(hook, type_name_, ".register_forward_pre_hook: the hook is empty");
  forward_pre_hooks_.push_back(std::move(hook));
}

void Module::register_forward_hook(ForwardHook hook) {
  LOOM_CHECK(hook, type_name_, ".register_forward_hook: the hook is empty");
  forward_hooks_.push_back(std::move(hook));
}

void Module::check_hooks_ran() const {
  LOOM_CHECK(!has_forward_hooks() || calling_through_hooks == this, type_name_, ".forward was called directly on a "
             "module with forward hooks, which only module(x) runs (Note [Forward hooks run in module(x)]); call it "
             "as (*module)(x)");
}

void Module::check_not_ancestor(const std::string& name, const Module& child) const {
  std::vector<const Module*> stack = {&child};
  std::unordered_set<const Module*> seen;  // shared submodules: each walked once
  while (!stack.empty()) {
    const Module* m = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;
    LOOM_CHECK(m != this, type_name_, ".register_module(\"", name, "\"): the ", child.type_name(),
               m == &child ? " is this module itself" : " contains this module", "; a module tree cannot have cycles");
    for (const auto& c : m->children_.values()) stack.push_back(c.get());
  }
}

void Module::check_new_name(const std::string& name, Kind kind) const {
  LOOM_CHECK(!name.empty(), type_name_, ": a parameter, buffer or module name cannot be empty");
  LOOM_CHECK(name.find('.') == std::string::npos, type_name_, ": name \"", name,
             "\" contains '.', which would break dotted state_dict keys");
  const bool other_kind = (kind != Kind::Parameter && parameters_.contains(name)) ||
                          (kind != Kind::Buffer && buffers_.contains(name)) ||
                          (kind != Kind::Module && children_.contains(name));
  LOOM_CHECK(!other_kind, type_name_, ": \"", name, "\" is already registered as a different kind (parameter, "
             "buffer or module); choose another name");
}

Tensor& Module::register_parameter(const std::string& name, const Tensor& tensor, bool requires_grad) {
  check_new_name(name, Kind::Parameter);
  if (!tensor.defined()) return parameters_.insert(name, Tensor());
  LOOM_CHECK(tensor.is_leaf(), type_name_, ".register_parameter(\"", name, "\"): a parameter must be a leaf tensor, "
             "but this one was produced by ", tensor.grad_fn()->name(), "; pass tensor.detach()");
  LOOM_CHECK(is_floating(tensor.dtype()), type_name_, ".register_parameter(\"", name,
             "\"): parameters must be floating point, got ", tensor.dtype(), "; use register_buffer for other state");
  Tensor p = tensor;  // the caller's handle is the parameter (no copy), as PyTorch
  p.requires_grad_(requires_grad);
  return parameters_.insert(name, p);
}

Tensor& Module::register_buffer(const std::string& name, const Tensor& tensor, bool persistent) {
  check_new_name(name, Kind::Buffer);
  if (persistent) non_persistent_buffers_.erase(name);
  else non_persistent_buffers_.insert(name);
  return buffers_.insert(name, tensor);
}

void Module::clear_registrations() {
  parameters_.clear();
  buffers_.clear();
  children_.clear();
  non_persistent_buffers_.clear();
}

void Module::collect(bool parameters, const std::string& prefix, bool recurse, bool dedupe,
                     OrderedDict<Tensor>& out, std::set<const TensorImpl*>& seen) const {
  for (const auto& [name, t] : parameters ? parameters_ : buffers_) {
    if (!t.defined()) continue;
    if (dedupe && !seen.insert(t.unsafe_impl()).second) continue;
    out.insert(prefix + name, t);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(parameters, prefix + name + ".", true, dedupe, out, seen);
}

OrderedDict<Tensor> Module::named_parameters(bool recurse) const {
  OrderedDict<Tensor> out;
  std::set<const TensorImpl*> seen;
  collect(/*parameters=*/true, "", recurse, /*dedupe=*/true, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const { return named_parameters(recurse).values(); }

OrderedDict<Tensor> Module::named_buffers(bool recurse) const {
  OrderedDict<Tensor> out;
  std::set<const TensorImpl*> seen;
  collect(/*parameters=*/false, "", recurse, /*dedupe=*/true, out, seen);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const { return named_buffers(recurse).values(); }

OrderedDict<std::shared_ptr<Module>> Module::named_modules(const std::string& prefix) {
  std::shared_ptr<Module> self = weak_from_this().lock();
  LOOM_CHECK(self, type_name_, ".named_modules(): the module must be owned by a std::shared_ptr (create it with "
             "std::make_shared)");
  OrderedDict<std::shared_ptr<Module>> out;
  out.insert(prefix, self);
  for (const auto& [name, child] : children_) {
    for (auto& [sub_name, sub] : child->named_modules(prefix.empty() ? name : prefix + "." + name))
      out.insert(sub_name, sub);
  }
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (const auto& [name, child] : children_) child->apply(fn);
  fn(*this);
}

void Module::to(Device device, bool non_blocking) {
  auto move = [&](const Tensor& t) { return t.device() == device ? t : t.to(device, non_blocking); };
  apply([&](Module& m) {
    for (const auto& [name, p] : m.parameters_) convert_in_place(p, move);
    for (const auto& [name, b] : m.buffers_) convert_in_place(b, move);
  });
}

void Module::to(DType dtype) {
  LOOM_CHECK(is_floating(dtype), type_name_, ".to(", dtype, "): modules can only be converted to a floating-point "
             "dtype (integer buffers such as num_batches_tracked keep theirs)");
  auto cast = [&](const Tensor& t) { return is_floating(t.dtype()) ? t.to(dtype) : t; };
  apply([&](Module& m) {
    for (const auto& [name, p] : m.parameters_) convert_in_place(p, cast);
    for (const auto& [name, b] : m.buffers_) convert_in_place(b, cast);
  });
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters()) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else grad.zero_();
  }
}

std::shared_ptr<Module> Module::clone_structure() const {
  LOOM_FAIL(type_name_, " does not support clone(): derive it from nn::Cloneable<", type_name_,
            "> and move its constructor's body into reset() (see Note [Cloneable] in nn/module.h)");
}

std::shared_ptr<Module> Module::clone(std::optional<Device> device) const {
  std::shared_ptr<Module> copy = clone_structure();
  copy->copy_state_from(*this, device);
  return copy;
}

void Module::copy_state_from(const Module& source, const std::optional<Device>& device) {
  // The structure came from clone_structure(), so a mismatch here is a bug in a layer's
  // reset() (it did not register what its constructor registers).
  auto check_same_keys = [&](const auto& mine, const auto& theirs, const char* kind) {
    LOOM_CHECK(mine.keys() == theirs.keys(), source.type_name_, ".clone(): reset() registered different ", kind,
               " than the original module has; reset() must register everything the layer owns");
  };
  check_same_keys(parameters_, source.parameters_, "parameters");
  check_same_keys(buffers_, source.buffers_, "buffers");
  check_same_keys(children_, source.children_, "children");
  for (const auto* kind : {&parameters_, &buffers_}) {
    for (const auto& [name, t] : *kind) {
      const Tensor* theirs = (kind == &parameters_ ? source.parameters_ : source.buffers_).find(name);
      LOOM_CHECK(!t.defined() || t.storage() != theirs->storage(), source.type_name_, ".clone(): reset() registered the "
                 "original's tensor \"", name, "\" instead of a new one (see Note [Cloneable])");
    }
  }
  NoGradGuard no_grad;
  for (const auto& [name, src] : source.parameters_) {
    const Tensor& dst = parameters_[name];
    if (!src.defined()) continue;
    set_data(dst, fresh_copy(src, device.value_or(src.device())));
    dst.unsafe_impl()->autograd.reset();  // a fresh leaf: no grad, no hooks, no accumulator
    Tensor(dst).requires_grad_(src.requires_grad());
  }
  for (const auto& [name, src] : source.buffers_) {
    if (src.defined()) set_data(buffers_[name], fresh_copy(src, device.value_or(src.device())));
  }
  training_ = source.training_;
  activation_checkpointing_ = source.activation_checkpointing_;
  for (const auto& [name, child] : source.children_) children_[name]->copy_state_from(*child, device);
}

std::string Module::str() const {
  std::ostringstream out;
  out << type_name_ << "(" << extra_repr();
  if (!children_.empty()) {
    out << "\n";
    for (const auto& [name, child] : children_) {
      std::string text = child->str();
      // Indent nested lines so the tree reads like PyTorch's print(model).
      for (size_t pos = text.find('\n'); pos != std::string::npos; pos = text.find('\n', pos + 1))
        text.insert(pos + 1, "  ");
      out << "  (" << name << "): " << text << "\n";
    }
  }
  out << ")";
  return out.str();
}

}  // namespace loom::nn
