#include "autograd/node.h"

#include <limits>

#include "autograd/grad_mode.h"
#include "autograd/variable.h"
#include "core/error.h"

namespace loom {
namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}  // namespace

Node::Node(std::string name, std::vector<Edge> next_edges)
    : sequence_nr_(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)),
      name_(std::move(name)),
      next_edges_(std::move(next_edges)) {}

FunctionNode::FunctionNode(std::string name, std::vector<Edge> next_edges, Backward backward, bool saves_tensors)
    : Node(std::move(name), std::move(next_edges)), backward_(std::move(backward)), saves_tensors_(saves_tensors) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) { return backward_(grads); }

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad", {}), leaf_(std::move(leaf)) {
  // See Note [AccumulateGrad runs first].
  sequence_nr_ = std::numeric_limits<uint64_t>::max();
  outputs.push_back(OutputMeta{leaf_->shape, leaf_->dtype, leaf_->storage->device()});
}

const Tensor& check_hook_result(const Tensor& replaced, const Tensor& grad, const std::string& whose) {
  LOOM_CHECK(replaced.shape() == grad.shape() && replaced.dtype() == grad.dtype() && replaced.device() == grad.device(),
             "a gradient hook ", whose, " returned a ", replaced.dtype(), " tensor of shape ", replaced.shape(), " on ",
             replaced.device(), " for a gradient of shape ", grad.shape(), ", ", grad.dtype(), " on ", grad.device(),
             ": a hook that replaces a gradient must keep its shape, dtype and device");
  return replaced;
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor grad = grads.at(0);
  AutogradMeta& meta = *leaf_->autograd;
  Tensor leaf(leaf_);
  std::vector<std::function<void(const Tensor&)>> post_hooks;
  {
    std::lock_guard<std::mutex> lock(meta.mutex);
    for (auto& hook : meta.leaf_hooks) {
      Tensor replaced = hook(grad);
      if (replaced.defined()) grad = check_hook_result(replaced, grad, "of a leaf");
    }
    if (!meta.grad.defined()) {
      // Steal the incoming buffer when nobody else can see it; otherwise copy, so two
      // leaves never share one .grad (an in-place add into one would change both).
      bool unshared = grad.is_contiguous() && grad.storage().use_count() == 1 &&
                      grad.storage_offset() == 0 && grad.storage()->nbytes() == grad.nbytes();
      meta.grad = unshared ? grad.detach() : grad.clone();
    } else {
      meta.grad.add_(grad);
    }
    post_hooks = meta.post_accumulate_hooks;
  }
  for (auto& hook : post_hooks) hook(leaf);
  return {};
}

}  // namespace loom
