// The pipeline as one process per stage, in one call: what a trainer needs beyond
// PipelineStage itself (torchtitan's pipeline_llm / apply_pp step over a plain model).
//
//   auto stage = parallel::pipeline::apply_pipeline_processes(
//       model->sequential(), pp_group, Device("cpu"),
//       {.balance = {}, .balance_by = "cost", .n_microbatches = 4, .schedule = "interleaved_1f1b", .virtual_stages = 2},
//       loss_fn, sample, world);
//   optim::SGD opt(stage->parameters(), ...);   // this rank's virtual stages only
//   auto r = stage->step(images, labels);       // every rank passes the batch
//   stage->share_weights();                     // before evaluating or saving the whole model
//
// Note [One balance for every rank]
// Every rank of the world must cut the model alike: the stages of one pipeline, and under
// pp × dp the replicas of each stage, whose data-parallel wrappers refuse models of
// different shapes. So the balance is agreed over the whole world, not one pipeline group:
//   - given counts (balance {4, 3, 4, 3}) are checked against the model's length;
//   - by cost (the default; Note [Balance by a cost model], parallel/balance.h) every rank
//     computes the same counts from the shapes alone;
//   - by time (balance_by "time") global rank 0 measures, once, and broadcasts to the world:
//     measured on each pipeline group's rank 0, the groups would time the layers under
//     different loads and cut the model differently.
// Then every rank's balance is gathered and compared, whichever way it was made, and a
// disagreement is an error naming the ranks and their balances, before any training.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/balance.h"                   // defines: choose_balance, check_balance
#include "parallel/pipeline/pipeline_stage.h"  // defines: PipelineStage

namespace loom::parallel::pipeline {

struct PipelineProcessOptions {
  std::vector<int64_t> balance;     // layers per virtual stage (S·V entries); empty: by balance_by
  std::string balance_by = "cost";  // cost | time: Note [One balance for every rank]
  int64_t n_microbatches = 4;       // micro-batches per batch (PyTorch pipelining's name; torchgpipe's chunks)
  std::string schedule = "1f1b";    // gpipe | 1f1b | interleaved_1f1b
  int64_t virtual_stages = 1;       // V: virtual stages per rank (interleaved_1f1b)
  std::string checkpoint = "never";  // never | except_last | always: PipelineStage::set_checkpoint
};

// See Note [One balance for every rank]: `balance` if given (checked), else by `by`
// ("cost": computed on every rank; "time": world rank 0's balance_by_time of `layers` on
// `sample`, broadcast over `world`), into `stages` groups; then checked against every
// rank of `world` (a collective over it).
std::vector<int64_t> agree_on_balance(nn::Sequential& layers, const std::vector<int64_t>& balance,
                                      const std::string& by, int64_t stages, const Tensor& sample,
                                      distributed::Communicator& world);

// A loom::Error on every rank unless every rank of `world` holds the same `balance`,
// naming the ranks and what each holds (a collective over `world`).
void check_same_balance(const std::vector<int64_t>& balance, distributed::Communicator& world);

// This rank's stage of `layers` (a Sequential every rank built alike): a collective
// over `group` (its rank = the stage) and `world` (every rank that runs a stage of this
// model: the pipeline's ranks, or under pp × dp every pipeline's; null: `group`).
// `sample`: a micro-batch of inputs to balance with when options.balance is empty.
std::shared_ptr<PipelineStage> apply_pipeline_processes(std::shared_ptr<nn::Sequential> layers,
                                                        std::shared_ptr<distributed::Communicator> group, Device device,
                                                        const PipelineProcessOptions& options,
                                                        PipelineStage::LossFn loss_fn, const Tensor& sample,
                                                        std::shared_ptr<distributed::Communicator> world = nullptr);

}  // namespace loom::parallel::pipeline
