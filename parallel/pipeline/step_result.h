// What one pipeline step gives back, whether its stages are threads of one process
// (Pipeline::step) or processes (PipelineStage::step), and the one call both answer
// (PipelineSchedule), so that the training loop drives either without knowing which.
#pragma once

#include "core/tensor.h"  // defines: Tensor

namespace loom::parallel::pipeline {

struct StepResult {
  // The batch's loss (Note [Micro-batch losses add up to the batch's]), detached; under
  // processes on every rank (all-reduced), float64 on the CPU.
  Tensor loss;
  // The last stage's outputs of every micro-batch, concatenated, detached; under processes
  // only where the last stage runs (undefined elsewhere).
  Tensor output;
};

// A pipeline as the loop sees it: forward and backward of every micro-batch of one batch
// under its schedule, in one call (torch.distributed.pipelining's schedule.step(x,
// target=y)). The parameters' gradients accumulate: zero_grad first. loss_scale multiplies
// every micro-batch's loss before its backward (GradScaler's scale); the result's loss is
// unscaled.
class PipelineSchedule {
 public:
  virtual ~PipelineSchedule() = default;
  virtual StepResult step(const Tensor& input, const Tensor& target, double loss_scale = 1.0) = 0;
};

}  // namespace loom::parallel::pipeline
