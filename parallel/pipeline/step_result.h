// What one pipeline step gives back, whether its stages are threads of one process
// (Pipeline::step) or processes (PipelineStage::step): the training loop reads both alike.
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

}  // namespace loom::parallel::pipeline
