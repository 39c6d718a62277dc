// One pipeline step's work, one action at a time: the forward of one micro-batch through
// one virtual stage (recomputable), the last virtual stage's loss, and the backward of
// one micro-batch. The in-process Pipeline (stages as threads, pipeline.h) and
// PipelineStage (stages as processes, pipeline_stage.h) run their schedule's actions
// through it, so they differ only in how activations and gradients travel between
// virtual stages (a device copy, or send / recv) and in how a stage waits for them.
//
//   MicrobatchRunner run(virtual_stages, /*stages=*/S, loss_fn, batch, n_microbatches, input, target);
//   Tensor activation = run.forward(c, m, from_previous);  // what virtual stage c + 1 takes
//   Tensor gradient = run.backward(c, m, from_next);       // of c's input: what c - 1 takes
//   Tensor loss = run.loss(), output = run.output();       // where the last virtual stage ran
//
// Note [One graph per virtual stage and micro-batch]
// The model is cut into S·V virtual stages (Note [Interleaved 1F1B: virtual stages]; with
// V = 1 virtual stage c is stage c). The input of virtual stage c > 0 is the output of
// c - 1, detached and moved to c's device, where it becomes a leaf that requires grad.
// So every (virtual stage, micro-batch) has an autograd graph of its own: the stages
// back-propagate concurrently on their threads (autograd/engine.h allows independent
// graphs on different threads) or in their processes, and the backward of micro-batch m
// on c starts from the gradient that c + 1's backward left in c + 1's input leaf. forward
// keeps the graph's root (the output; on the last virtual stage the weighted, scaled
// loss) until backward, which frees it. Both pipelines run exactly these ops, in the
// order of the same schedule, and every virtual stage accumulates its micro-batches'
// gradients in the order 0, 1, ... (every schedule's): processes and threads give
// bitwise the same weights (tests/test_pipeline_stage.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"                 // defines: Device
#include "core/tensor.h"                 // defines: Tensor
#include "nn/module.h"                   // defines: nn::Module
#include "parallel/pipeline/schedule.h"  // defines: Action

namespace loom::parallel::pipeline {

// Returns a mean over its micro-batch (as cross_entropy does): Note [Micro-batch losses
// add up to the batch's] (pipeline.h).
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

// The micro-batch sizes chunk(batch, n_microbatches) gives: ceil(B / n) each, the last
// what remains (fewer micro-batches than asked when the batch is small). Every process
// of a pipeline derives them from the batch size alone.
std::vector<int64_t> micro_batch_sizes(int64_t batch, int64_t n_microbatches);

// "stage 1", or with V > 1 virtual stages per stage "virtual stage 3 (on stage 1)".
std::string virtual_stage_name(int64_t virtual_stage, int64_t stages, int64_t virtual_stages);

// The trace span's name of an action: "F3 stage 1", with virtual stages "F3 stage 1
// virtual stage 3". Shared by both pipelines, so their traces read (and are measured:
// docs/pipeline.md, bench/timeline.py) alike.
std::string action_name(const Action& action, int64_t stage, int64_t stages, int64_t virtual_stages);

class MicrobatchRunner {
 public:
  struct VirtualStage {
    // What runs it (its Sequential, or a wrapper: FSDP); null where another process does.
    nn::Module* module = nullptr;
    Device device;                 // where it runs: its inputs are moved there
  };

  // virtual_stages: all S·V, in model order; stages: S. batch: the batch's size, from
  // which the micro-batches are cut; input / target: the batch, where this process runs
  // the first / the last virtual stage (else undefined). loss_fn must outlive the
  // runner. loss_scale multiplies every micro-batch's loss before its backward
  // (GradScaler's scale). checkpoint: "never", "except_last" or "always" (Note
  // [Checkpointed micro-batches are recomputed exactly], pipeline.h): a virtual stage
  // that could not be recomputed exactly (a Dropout in training mode) is refused here.
  MicrobatchRunner(std::vector<VirtualStage> virtual_stages, int64_t stages, const LossFn& loss_fn, int64_t batch,
                   int64_t n_microbatches, const Tensor& input, const Tensor& target, double loss_scale = 1.0,
                   std::string checkpoint = "never");

  // M: the micro-batches this batch gives, and their sizes.
  int64_t n_microbatches() const { return static_cast<int64_t>(sizes_.size()); }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  // Whether micro-batch m's forward runs without a graph and is recomputed in its
  // backward; recomputes(): whether any is (the first is, if any is).
  bool checkpointed(int64_t m) const;
  bool recomputes() const { return checkpointed(0); }
  // After the step: a loom::Error if micro-batches were recomputed and the default
  // generator moved during the step (a random op: the recomputation drew other numbers).
  void check_recomputed_exactly() const;

  // The forward of micro-batch m on virtual stage c, from what c - 1's forward returned
  // (on any device; undefined for c = 0, which takes the micro-batch of the input).
  // Returns c's output, detached, for c + 1; undefined on the last virtual stage, which
  // computes the micro-batch's loss (Note [Micro-batch losses add up to the batch's]).
  Tensor forward(int64_t c, int64_t m, const Tensor& from_previous = Tensor());
  // The backward of micro-batch m on virtual stage c, from the gradient of its output
  // that c + 1's backward returned (on any device; undefined on the last virtual stage,
  // which starts from its loss). Returns the gradient of c's input, for c - 1; undefined
  // for c = 0.
  Tensor backward(int64_t c, int64_t m, const Tensor& from_next = Tensor());
  // The graph root forward keeps for backward: its dtype and shape are those of the
  // gradient backward takes. Undefined before the forward, after the backward, and for
  // checkpointed micro-batches.
  const Tensor& kept_output(int64_t c, int64_t m) const { return outputs_[size_t(c)][size_t(m)]; }

  // The batch's loss (the micro-batches' weighted losses added up, unscaled) and the
  // last virtual stage's outputs of every micro-batch, concatenated; both detached. Only
  // where the last virtual stage ran, after every micro-batch's forward.
  Tensor loss() const;
  Tensor output() const;

 private:
  // The module of virtual stage c on x; on the last, the weighted, scaled loss.
  Tensor run(int64_t c, int64_t m, const Tensor& x);
  std::string name(int64_t c) const;

  std::vector<VirtualStage> virtual_stages_;
  int64_t stages_;
  const LossFn& loss_fn_;
  int64_t batch_;
  double loss_scale_;
  std::string checkpoint_;
  std::vector<int64_t> sizes_;
  uint64_t random_offset_ = 0;  // the default generator's before the step
  std::vector<Tensor> micro_inputs_, micro_targets_;  // [m], where this process needs them
  std::vector<std::vector<Tensor>> inputs_;   // [c][m]: c's input leaf (c > 0), or kept for recomputation
  std::vector<std::vector<Tensor>> outputs_;  // [c][m]: the graph's root, until the backward
  std::vector<Tensor> losses_, logits_;       // [m]: detached, where the last virtual stage ran
};

}  // namespace loom::parallel::pipeline
