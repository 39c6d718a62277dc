// Tensor's autograd methods and the recording helpers of autograd/variable.h.
#include "autograd/variable.h"

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/error.h"

namespace loom {
namespace {

AutogradMeta& ensure_meta(TensorImpl& impl) {
  if (!impl.autograd) impl.autograd = std::make_shared<AutogradMeta>();
  return *impl.autograd;
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& meta = *leaf.unsafe_impl()->autograd;
  std::lock_guard<std::mutex> lock(meta.mutex);
  auto accumulator = meta.grad_accumulator.lock();
  if (!accumulator) {
    // The accumulator holds the leaf strongly; the leaf holds it weakly (no cycle).
    accumulator = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    meta.grad_accumulator = accumulator;
  }
  return accumulator;
}

}  // namespace

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& input) {
  if (!input.defined() || !input.requires_grad()) return {};
  const AutogradMeta& meta = *input.unsafe_impl()->autograd;
  if (meta.grad_fn) return Edge{meta.grad_fn, meta.output_nr};
  return Edge{grad_accumulator(input), 0};
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            FunctionNode::Backward backward, bool saves_tensors) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& input : inputs) edges.push_back(gradient_edge(input));
  auto node = std::make_shared<FunctionNode>(name, std::move(edges), std::move(backward), saves_tensors);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    AutogradMeta& meta = ensure_meta(*out.unsafe_impl());
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
    node->outputs.push_back(OutputMeta{out.shape(), out.dtype(), out.device()});
  }
}

// ---- Tensor's autograd methods ----------------------------------------------------------

bool Tensor::requires_grad() const {
  const auto& meta = impl().autograd;
  return meta && (meta->requires_grad || meta->grad_fn);
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  AutogradMeta& meta = ensure_meta(impl());
  LOOM_CHECK(!meta.grad_fn || requires_grad,
             "requires_grad_(false) is only valid on leaf tensors; this one was produced by ",
             meta.grad_fn->name(), ". Use detach() to get a tensor without history");
  LOOM_CHECK(!requires_grad || is_floating(dtype()), "only floating-point tensors can require gradients, got ",
             dtype());
  meta.requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  const auto& meta = impl().autograd;
  return !meta || !meta->grad_fn;
}

Tensor Tensor::grad() const {
  const auto& meta = impl().autograd;
  if (!meta) return {};
  std::lock_guard<std::mutex> lock(meta->mutex);
  return meta->grad;
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    LOOM_CHECK(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
               "set_grad: expected a gradient like ", str(), ", got ", grad.str());
  }
  AutogradMeta& meta = ensure_meta(impl());
  std::lock_guard<std::mutex> lock(meta.mutex);
  meta.grad = grad;
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  const auto& meta = impl().autograd;
  return meta ? meta->grad_fn : nullptr;
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, {grad}, retain_graph);
}

Tensor Tensor::detach() const {
  const TensorImpl& self = impl();
  return make_tensor(self.storage, self.shape, self.strides, self.offset, self.dtype);
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  LOOM_CHECK(requires_grad(), "register_hook: cannot register a hook on a tensor that doesn't require grad");
  AutogradMeta& meta = *impl().autograd;
  if (meta.grad_fn) {
    meta.grad_fn->pre_hooks[meta.output_nr].push_back(std::move(hook));
  } else {
    std::lock_guard<std::mutex> lock(meta.mutex);
    meta.leaf_hooks.push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  LOOM_CHECK(requires_grad() && is_leaf(),
             "register_post_accumulate_grad_hook: only leaf tensors that require grad accumulate "
             "gradients; got ", str(), requires_grad() ? " (a non-leaf)" : " (does not require grad)");
  AutogradMeta& meta = *impl().autograd;
  std::lock_guard<std::mutex> lock(meta.mutex);
  meta.post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace loom
