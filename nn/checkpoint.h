// Activation checkpointing: a segment of the forward keeps only its input, and backward
// runs the segment again to get the activations it needs; torch.utils.checkpoint.
//
//   Tensor y = nn::checkpoint([&](const Tensor& x) { return (*block)(x); }, x, block.get());
//
//   // or mark modules, as torch.distributed.algorithms' apply_activation_checkpointing:
//   nn::apply_activation_checkpointing(*model, [](const std::string& name, nn::Module& m) {
//     return dynamic_cast<nn::BasicBlock*>(&m) != nullptr;      // every residual block
//   });
//   Tensor loss = criterion((*model)(x), t);                   // blocks keep their inputs only
//   loss.backward();                                            // ...and run again here
//
// Note [Activation checkpointing]
// Training keeps every activation a backward formula needs from the forward to the
// backward: for a ResNet or a ViT at a useful batch, far more memory than the model's
// parameters, gradients and optimizer state together. A checkpointed segment runs its
// forward without recording a graph (under no_grad: its activations are freed as the
// segment goes), keeping only its input, and records one node in its place. When backward
// reaches that node, it runs the segment's forward again with the graph, then
// back-propagates through it (Note [A backward inside a backward], autograd/engine.h),
// which writes the parameters' gradients and gives the input's. The price is one more
// forward of every checkpointed segment (a third more arithmetic per step, when every
// segment is); the saving is all of its activations but its input, until its backward.
// This is the reentrant form of torch.utils.checkpoint (use_reentrant=True), chosen
// because it needs nothing from the ops: the segment is recomputed as a whole.
//
// Note [A recomputation is the same forward]
// For the gradients to be bitwise those of a training step without checkpointing, the
// recomputation must compute exactly what the first forward did:
// - the same input (kept, and checked unmodified: Note [Saved tensors]) and parameters
//   (the optimizer steps after backward);
// - the same autocast state: backward runs with autocast off (Note [No autocast in
//   backward]), so the checkpoint notes the forward's and restores it;
// - the same random numbers: Note [A recomputation draws its random numbers again];
// - buffers as the first forward found them, and left as it left them: BatchNorm in
//   training normalises with the batch's statistics, never reading its running ones,
//   but updates them, and the recomputation would update them a second time. So the
//   buffers of the module named as the segment's owner are copied before the
//   recomputation and put back after it (RestoreBuffers).
// The tests compare weights and running statistics after several steps with and
// without checkpointing, under one process, DDP and FSDP (tests/test_checkpoint.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"  // defines: Tensor
#include "nn/module.h"    // defines: Module

namespace loom::nn {

// torch.utils.checkpoint.checkpoint(fn, input): fn(input), keeping only `input` for
// backward, which runs fn again (Note [Activation checkpointing]). `buffers_of`, when
// given, is the module whose buffers fn updates (a block with BatchNorm): they are put
// back after the recomputation. Without grad mode it is fn(input).
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const Module* buffers_of = nullptr);

// Marks every module for which check_fn(name, module) is true (names as named_modules
// gives them): module(x) then runs its forward under checkpoint(), its own forward hooks
// outside it. torch.distributed.algorithms._checkpoint.checkpoint_wrapper's
// apply_activation_checkpointing, without the wrapper module: names and state-dict keys
// stay the same, so FSDP units, pipeline stages and tensor-parallel plans still find them.
// Returns the names marked.
std::vector<std::string> apply_activation_checkpointing(
    Module& model, const std::function<bool(const std::string& name, Module& module)>& check_fn);

// Puts a module's buffers (BatchNorm's running statistics) back as they were when it was
// made, however its scope ends (a recomputation that throws included).
class RestoreBuffers {
 public:
  explicit RestoreBuffers(const Module& module);
  ~RestoreBuffers();
  RestoreBuffers(const RestoreBuffers&) = delete;
  RestoreBuffers& operator=(const RestoreBuffers&) = delete;

 private:
  std::vector<Tensor> buffers_, copies_;
};

}  // namespace loom::nn
