// The pipeline as one process per stage, in one call: what a trainer needs beyond
// PipelineStage itself (torchtitan's pipeline_llm / apply_pp step over a plain model).
//
//   auto stage = parallel::pipeline::apply_pipeline_processes(
//       model->sequential(), pp_group, Device("cpu"),
//       {.balance = {}, .chunks = 4, .schedule = "interleaved_1f1b", .virtual_stages = 2}, loss_fn, sample);
//   optim::SGD opt(stage->parameters(), ...);   // this rank's chunks only
//   auto r = stage->step(images, labels);       // every rank passes the batch
//   stage->share_weights();                     // before evaluating or saving the whole model
//
// Note [One balance for every rank]
// Every rank must cut the model alike, and a measured balance (balance_by_time) differs
// from process to process with the machine's noise. So without a --balance the group's
// rank 0 measures and broadcasts its result; a given balance is checked against the
// model's length and the pipeline's S·V chunks here, with the flags' names, and the
// ranks' agreement is checked again by PipelineStage's construction.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/pipeline/pipeline_stage.h"  // defines: PipelineStage

namespace loom::parallel::pipeline {

struct PipelineProcessOptions {
  std::vector<int64_t> balance;     // layers per model chunk (S·V entries); empty: measured (Note [One balance for every rank])
  int64_t chunks = 4;               // micro-batches per batch
  std::string schedule = "1f1b";    // gpipe | 1f1b | interleaved_1f1b
  int64_t virtual_stages = 1;       // V: model chunks per rank (interleaved_1f1b)
};

// A loom::Error unless `balance` has `chunks` positive entries adding up to `layers`,
// naming the Sequential's length (torchgpipe's balance; the trainer's --balance).
void check_balance(const std::vector<int64_t>& balance, int64_t chunks, int64_t layers);

// See Note [One balance for every rank]: `balance` if given (checked), else rank 0's
// balance_by_time of `layers` on `sample` into `chunks` groups, broadcast to the group.
std::vector<int64_t> agree_on_balance(nn::Sequential& layers, const std::vector<int64_t>& balance, int64_t chunks,
                                      const Tensor& sample, distributed::Communicator& group);

// This rank's stage of `layers` (a Sequential every rank built alike): a collective
// over `group` (its rank = the stage). `sample`: a micro-batch of inputs to measure the
// balance with when options.balance is empty.
std::shared_ptr<PipelineStage> apply_pipeline_processes(std::shared_ptr<nn::Sequential> layers,
                                                        std::shared_ptr<distributed::Communicator> group, Device device,
                                                        const PipelineProcessOptions& options,
                                                        PipelineStage::LossFn loss_fn, const Tensor& sample);

}  // namespace loom::parallel::pipeline
