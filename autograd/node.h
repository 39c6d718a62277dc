// Node: one recorded op in the tape, and the edges that link nodes into a graph.
//
// When an op runs with grad mode on and some input requires grad, it creates a Node
// that knows (a) where each input's gradient must go next (next_edges: the producing
// node of each input, or the leaf's AccumulateGrad), (b) the shape/dtype/device of
// each forward output, so the engine can check incoming gradients, and (c) how to turn
// output gradients into input gradients (apply). Outputs point at the node through
// their grad_fn; the node does not point back at its outputs (see Note [Saved tensors]).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace loom {

class Node;

struct Edge {
  std::shared_ptr<Node> function;  // null: this input needs no gradient
  uint32_t input_nr = 0;           // which of function's outputs this input was
  bool valid() const { return function != nullptr; }
};

struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

using TensorHook = std::function<Tensor(const Tensor&)>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node(std::string name, std::vector<Edge> next_edges);
  virtual ~Node() = default;

  // grads: one per forward output (the engine fills zeros where none arrived).
  // Returns one gradient per next edge (undefined where the input needs none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // Drops what the forward saved; called after apply unless retain_graph.
  virtual void release_saved() {}
  virtual bool is_released() const { return false; }

  const std::string& name() const { return name_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  // Larger runs first in backward: later ops are differentiated first.
  uint64_t sequence_nr() const { return sequence_nr_; }

  std::vector<OutputMeta> outputs;                 // filled by set_history
  std::map<uint32_t, std::vector<TensorHook>> pre_hooks;  // by output index

 protected:
  uint64_t sequence_nr_;

 private:
  std::string name_;
  std::vector<Edge> next_edges_;
};

// A Node whose backward is a closure: the closure owns what the forward saved, so
// release_saved() is simply dropping the closure.
//
// Note [Nodes that save nothing]
// A closure that captured no tensors (a dtype cast, a device copy: only the source dtype
// or device) has nothing to free, and PyTorch lets a graph be back-propagated through
// such nodes again. It matters when one node is shared by several backward passes:
// autocast's weight cast cache (Note [Weight cast cache]) hands every micro-batch of a
// pipeline step, or every forward of gradient accumulation inside one autocast scope,
// the same cast of a weight. Such nodes are recorded with saves_tensors = false and keep
// their closure.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;
  FunctionNode(std::string name, std::vector<Edge> next_edges, Backward backward, bool saves_tensors = true);

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  void release_saved() override {
    if (saves_tensors_) backward_ = nullptr;
  }
  bool is_released() const override { return !backward_; }

 private:
  Backward backward_;
  bool saves_tensors_;
};

// A gradient hook may replace the gradient, but not its shape, dtype or device (as in
// PyTorch); `whose` names the hook's owner in the error. Returns `replaced`.
const Tensor& check_hook_result(const Tensor& replaced, const Tensor& grad, const std::string& whose);

// The sink of a leaf's gradient: adds it into leaf.grad() and runs the leaf's hooks.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

}  // namespace loom
