// AutogradMeta: what a tensor carries for autograd, and the helpers ops use to record.
//
// A tensor is a *leaf* when it has no grad_fn: created by the user (parameters,
// inputs), or produced while no input required grad. Leaves that require grad collect
// gradients in grad(); non-leaves pass gradients on to their grad_fn.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

#include "autograd/node.h"
#include "core/tensor.h"

namespace loom {

struct AutogradMeta {
  bool requires_grad = false;         // for leaves; non-leaves require grad by having grad_fn
  Tensor grad;
  std::shared_ptr<Node> grad_fn;      // null for leaves
  uint32_t output_nr = 0;             // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // leaves: shared by every edge into this leaf
  std::vector<TensorHook> leaf_hooks;    // leaves: run on the gradient before accumulation
  std::vector<std::function<void(const Tensor&)>> post_accumulate_hooks;
  // Guards grad and the accumulator: several threads may back-propagate into the same
  // leaf (DP replicas, pipeline micro-batches).
  std::mutex mutex;
};

// True when grad mode is on and any defined input requires grad.
bool any_requires_grad(std::initializer_list<Tensor> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);

// The edge along which `input`'s gradient should travel (invalid if it needs none).
Edge gradient_edge(const Tensor& input);

// Records `backward` as the grad_fn of `outputs`, with one edge per input.
// backward receives one gradient per output and returns one per input. saves_tensors =
// false for a backward that captures no tensors (a cast, a device copy): such a node
// can be back-propagated through again (Note [Nodes that save nothing]).
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            FunctionNode::Backward backward, bool saves_tensors = true);

}  // namespace loom
