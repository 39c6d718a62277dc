#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/autocast.h"  // defines: autocast::DisableGuard
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "core/error.h"
#include "core/factory.h"

namespace loom::autograd {
namespace {

// The final callbacks of the backward() running on this thread (null outside backward).
// See Note [Final callbacks].
thread_local std::vector<std::function<void()>>* t_final_callbacks = nullptr;

// Installs a fresh callback list for one backward() and restores the outer one (a hook
// may itself call backward) however the call ends.
class FinalCallbacksScope {
 public:
  FinalCallbacksScope() : outer_(t_final_callbacks) { t_final_callbacks = &callbacks_; }
  ~FinalCallbacksScope() { t_final_callbacks = outer_; }
  FinalCallbacksScope(const FinalCallbacksScope&) = delete;
  FinalCallbacksScope& operator=(const FinalCallbacksScope&) = delete;

  void run_all() {
    for (size_t i = 0; i < callbacks_.size(); ++i) {
      auto callback = std::move(callbacks_[i]);  // a callback may queue more (reallocating)
      callback();
    }
    callbacks_.clear();
  }

 private:
  std::vector<std::function<void()>> callbacks_;
  std::vector<std::function<void()>>* outer_;
};

struct ReadyOrder {
  // See Note [AccumulateGrad runs first]: sequence numbers of AccumulateGrad are max.
  bool operator()(Node* a, Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

// Counts, for every node reachable from the roots, how many edges point into it.
std::unordered_map<Node*, int> count_dependencies(const std::vector<Edge>& roots) {
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& root : roots) {
    if (root.valid() && !seen[root.function.get()]) {
      seen[root.function.get()] = true;
      stack.push_back(root.function.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& next : node->next_edges()) {
      if (!next.valid()) continue;
      dependencies[next.function.get()] += 1;
      if (!seen[next.function.get()]) {
        seen[next.function.get()] = true;
        stack.push_back(next.function.get());
      }
    }
  }
  return dependencies;
}

// Sums the gradients arriving for one output of a node. The first is usually a fresh
// tensor nobody else holds (a residual block's input gets one from the convolution and
// one from the shortcut): it is summed into in place, as PyTorch's InputBuffer does,
// instead of allocating a third tensor of the same size. Anything shared (the same
// gradient delivered twice, a view, a tensor a hook kept) is added out of place.
void accumulate(std::vector<Tensor>& buffer, uint32_t slot, const Tensor& grad) {
  if (!grad.defined()) return;
  Tensor& sum = buffer[slot];
  if (!sum.defined()) {
    sum = grad;
    return;
  }
  const bool unshared = sum.impl_ptr().use_count() == 1 && sum.storage().use_count() == 1 && sum.is_contiguous() &&
                        sum.storage_offset() == 0;
  if (unshared) sum.add_(grad);
  else sum = sum.add(grad);
}

void check_gradient(const Node& node, uint32_t slot, const Tensor& grad, const char* came_from) {
  const OutputMeta& meta = node.outputs.at(slot);
  LOOM_CHECK(grad.shape() == meta.shape, came_from, " returned a gradient of shape ", grad.shape(),
             " for an input of ", node.name(), " whose output ", slot, " has shape ", meta.shape);
  LOOM_CHECK(grad.dtype() == meta.dtype && grad.device() == meta.device, came_from, " returned a ",
             grad.dtype(), " gradient on ", grad.device(), " for an input of ", node.name(),
             " that is ", meta.dtype, " on ", meta.device);
}

// Runs the graph from `roots` back to the leaves; the caller owns the final callbacks.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  LOOM_CHECK(roots.size() == grads.size(), "backward: got ", roots.size(), " roots but ", grads.size(),
             " gradients");
  NoGradGuard no_grad;  // backward formulas are not themselves recorded (no create_graph)
  autocast::DisableGuard no_autocast;  // See Note [No autocast in backward]

  std::vector<Edge> root_edges;
  std::vector<Tensor> root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    LOOM_CHECK(root.defined(), "backward: root ", i, " is an undefined tensor");
    LOOM_CHECK(root.requires_grad(), "backward: element ", i, " of the roots (", root.str(),
               ") does not require grad and has no grad_fn; did you forget requires_grad_() on an "
               "input, or compute it under NoGradGuard?");
    Tensor grad = grads[i];
    if (!grad.defined()) {
      LOOM_CHECK(root.numel() == 1, "backward: grad can be implicitly created only for one-element "
                 "outputs, but the root has shape ", root.shape(),
                 "; pass a gradient of that shape: y.backward(grad)");
      grad = ones_like(root);
    }
    LOOM_CHECK(grad.shape() == root.shape(), "backward: gradient has shape ", grad.shape(),
               " but the root has shape ", root.shape());
    root_edges.push_back(gradient_edge(root));
    root_grads.push_back(grad);
  }

  auto dependencies = count_dependencies(root_edges);
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;

  auto deliver = [&](const Edge& edge, const Tensor& grad, const char* came_from) {
    Node* next = edge.function.get();
    auto& buffer = buffers[next];
    if (buffer.empty()) buffer.resize(next->outputs.size());
    if (grad.defined()) check_gradient(*next, edge.input_nr, grad, came_from);
    accumulate(buffer, edge.input_nr, grad);
    keep_alive.emplace(next, edge.function);
  };

  for (size_t i = 0; i < root_edges.size(); ++i) {
    deliver(root_edges[i], root_grads[i], "backward's root gradient");
    Node* node = root_edges[i].function.get();
    if (dependencies[node] == 0) {
      dependencies[node] = -1;  // queued
      ready.push(node);
    }
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> inputs = std::move(buffers[node]);
    buffers.erase(node);
    inputs.resize(node->outputs.size());

    bool any_defined = false;
    for (uint32_t slot = 0; slot < inputs.size(); ++slot) {
      auto hooks = node->pre_hooks.find(slot);
      if (hooks != node->pre_hooks.end() && inputs[slot].defined()) {
        for (auto& hook : hooks->second) {
          Tensor replaced = hook(inputs[slot]);
          if (replaced.defined())
            inputs[slot] = check_hook_result(replaced, inputs[slot], "on an output of " + node->name());
        }
      }
      any_defined = any_defined || inputs[slot].defined();
    }

    std::vector<Tensor> outputs;
    if (any_defined) {
      LOOM_CHECK(!node->is_released(), "trying to backward through the graph a second time (", node->name(),
                 " has already freed its saved tensors); specify retain_graph=true on the first backward "
                 "if you need to call backward twice");
      for (uint32_t slot = 0; slot < inputs.size(); ++slot) {
        if (!inputs[slot].defined()) {  // an output that got no gradient contributes zero
          const OutputMeta& meta = node->outputs[slot];
          inputs[slot] = zeros(meta.shape, TensorOptions(meta.dtype).device(meta.device));
        }
      }
      outputs = node->apply(std::move(inputs));
      LOOM_CHECK(outputs.size() == node->next_edges().size(), node->name(), " returned ", outputs.size(),
                 " gradients for ", node->next_edges().size(), " inputs");
      if (!retain_graph) node->release_saved();
    }
    outputs.resize(node->next_edges().size());

    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].valid()) continue;
      deliver(edges[i], outputs[i], node->name().c_str());
      Node* next = edges[i].function.get();
      if (--dependencies[next] == 0) ready.push(next);
    }
    keep_alive.erase(node);
  }
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  FinalCallbacksScope final_callbacks;
  run_backward(roots, grads, retain_graph);
  final_callbacks.run_all();
}

void backward_within(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  LOOM_CHECK(t_final_callbacks != nullptr, "backward_within: no backward() is running on this thread; it runs a "
             "backward inside a running one (from a node's apply, as activation checkpointing's recomputation "
             "does). Call backward() instead");
  run_backward(roots, grads, /*retain_graph=*/false);
}

void queue_callback(std::function<void()> callback) {
  LOOM_CHECK(t_final_callbacks != nullptr, "queue_callback: no backward() is running on this thread; final "
             "callbacks can only be queued from inside backward (from a gradient hook)");
  t_final_callbacks->push_back(std::move(callback));
}

}  // namespace loom::autograd
