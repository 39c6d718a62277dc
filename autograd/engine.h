// The backward engine: runs the recorded graph in reverse.
//
// backward(roots, grads) seeds each root's gradient, then repeatedly runs the ready
// node with the largest sequence number (the most recently recorded op) until no node
// is left. A node becomes ready when every edge into it has delivered its gradient;
// the gradients arriving at the same output are summed first (the "input buffer").
//
// Note [AccumulateGrad runs first]
// AccumulateGrad nodes get the highest priority, so a parameter's gradient is written,
// and its post-accumulate hooks fire, as soon as it is complete - not after the whole
// backward. The DDP reducer relies on this to start all-reducing early buckets while
// backward is still computing the gradients of earlier layers.
//
// Each call runs on the calling thread with its own state, so independent graphs can
// be back-propagated concurrently from different threads.
#pragma once

#include <functional>
#include <vector>

#include "core/tensor.h"

namespace loom::autograd {

// grads[i] may be undefined for a one-element root (then 1 is used).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph = false);

// Note [A backward inside a backward]
// Activation checkpointing (torch.utils.checkpoint's reentrant form, nn/checkpoint.h)
// runs a segment's forward again from inside the outer backward, when its node is
// reached, and back-propagates through the recomputed graph there. That inner backward
// must not own its final callbacks: a gradient hook inside it (the DDP reducer's, FSDP's
// on a parameter's gradient) queues the "all gradients are in" callback of the *whole*
// backward, and running it when the segment ends would wait for buckets whose gradients
// the outer backward has not computed yet. backward_within(roots, grads) is backward()
// without a callback scope of its own: what its hooks queue runs when the outer backward
// ends. Outside a backward it is an error.
void backward_within(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads);

// Note [Final callbacks]
// queue_callback(fn), called from inside a backward() (from a hook), runs fn once that
// backward has computed every gradient, just before it returns on the same thread; an
// exception from fn leaves backward(). PyTorch's Variable._execution_engine.queue_callback.
// The DDP reducer uses it to wait for its gradient all-reduces exactly when backward ends,
// so that the training loop stays `loss.backward(); optimizer.step();`. Callbacks queued
// by a callback run too, in order. Outside backward it is an error.
void queue_callback(std::function<void()> callback);

}  // namespace loom::autograd
