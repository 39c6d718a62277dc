// Pipeline parallelism in one process: the stages of ModelParallel, each on its own
// thread, working on different micro-batches at once, each stage in the order a
// Schedule gives (GPipe, 1F1B or interleaved 1F1B, parallel/pipeline/schedule.h).
// torchgpipe's GPipe and PyTorch's torch.distributed.pipelining (Schedule1F1B) in one
// small class.
//
//   auto seq = nn::resnet18(10)->sequential();
//   parallel::pipeline::Pipeline pipe(seq, {"cpu:0", "cpu:1"}, {7, 7}, /*n_microbatches=*/4, "1f1b",
//                                     [&](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); });
//   optimizer.zero_grad();
//   auto result = pipe.step(images, labels);  // forward and backward of all 4 micro-batches
//   optimizer.step();                         // .grad(): the whole batch's mean-loss gradient
//
// Note [Stages wait only for what they need]
// Each stage's thread runs its own actions in the schedule's order (its row of the
// picture), and before each one waits until what it needs is done: the forward of
// micro-batch m on stage s needs m's forward on s - 1; its backward needs m's backward
// on s + 1 (on the last stage, m's forward there, which also computed the loss). Done
// flags under one mutex and a condition variable are the only synchronisation; an
// action only reads what another stage finished before the flag was set. Stages do not
// wait for each other's unrelated actions (a clock with a barrier per tick did: a
// stage's backward paired with the other's shorter forward wasted the difference at
// every tick, 841 ms a ResNet18 step instead of 710). Each action is MicrobatchRunner's
// (microbatch_runner.h): every stage's autograd graph is its own (Note [One graph per
// virtual stage and micro-batch]), so the stages back-propagate concurrently on their
// threads; what moves between them is a device copy of the activation forward and of
// the input's gradient back. The run is deterministic: each stage accumulates its
// micro-batches' gradients in its own fixed order, 0, 1, ... in every schedule, so GPipe
// and 1F1B give the same gradients bit for bit. A stage that throws wakes the others,
// which stop.
//
// Note [Micro-batch losses add up to the batch's]
// loss_fn returns a mean over its micro-batch (as cross_entropy does). Micro-batch m of
// size b_m is back-propagated with weight b_m / B, so the accumulated gradient is that
// of the mean over the whole batch of B: what one device computes on the whole batch,
// for models without batch statistics. (BatchNorm normalises each micro-batch by its own
// statistics, as in GPipe; its running statistics see M updates per step.)
//
// Note [Checkpointed micro-batches are recomputed exactly]
// With checkpoint = "always" (or "except_last": every micro-batch but the last, whose
// backward follows its forward at once in GPipe, so checkpointing it saves nothing; the
// last of those the batch gives, where torchgpipe counts from its `chunks` argument), as in
// torchgpipe, a stage's forward of a checkpointed micro-batch runs without recording a
// graph: it keeps only the stage's input, so the activations inside the stage are freed
// at once instead of living until the micro-batch's backward. That backward first runs
// the forward again, with the graph, then back-propagates through it. For the gradients
// to be the ones of the first forward, the recomputation must see what it saw:
// - the same input (kept) and parameters (unchanged within a step);
// - the same buffers, or none: BatchNorm in training normalises by the micro-batch's own
//   statistics, never reading its running ones, but it updates them, and the
//   recomputation would do so a second time. So the stage's buffers are copied before
//   the recomputation and put back after it: they end the step exactly as without
//   checkpointing. (A layer whose training forward read its buffers would see them as
//   the other micro-batches left them: loom has none);
// - the same random numbers, which loom cannot promise: the default generator is
//   process-wide and the stages draw from it concurrently, so a dropout mask cannot be
//   drawn again (torchgpipe restores each device's generator instead). So a stage with
//   a Dropout in training mode is refused before the step starts, and a checkpointed
//   step during which the default generator moved anyway (another random op) is an
//   error after it: never silently other gradients.
// Results are bitwise those of checkpoint = "never" (the tests compare them); the price
// is one more forward of every checkpointed micro-batch (docs/pipeline.md).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/model_parallel.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/step_result.h"  // defines: StepResult

namespace loom::parallel::pipeline {

class Pipeline : public ModelParallel, public PipelineSchedule {
 public:
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

  // n_microbatches: micro-batches per batch (PyTorch pipelining's name, torchgpipe's
  // `chunks`; fewer when the batch is smaller); schedule: "gpipe", "1f1b" or
  // "interleaved_1f1b", whose balance has S×V entries for the S devices: virtual stage c
  // on devices[c % S] (Note [Interleaved 1F1B: virtual stages]); checkpoint: "never",
  // "except_last" or "always" (torchgpipe's; Note [Checkpointed micro-batches are
  // recomputed exactly]). The default is "never", where torchgpipe's and PyTorch's
  // Pipe's is "except_last": recomputing costs a fifth of the throughput
  // (docs/pipeline.md), worth paying only where memory is what runs out. ModelParallel's
  // stages() are the S·V virtual stages.
  Pipeline(std::shared_ptr<nn::Sequential> module, std::vector<Device> devices, std::vector<int64_t> balance,
           int64_t n_microbatches, std::string schedule, LossFn loss_fn, std::string checkpoint = "never");

  using StepResult = ::loom::parallel::pipeline::StepResult;  // the batch's loss and the last stage's outputs
  // Forward and backward of one batch under the schedule; the parameters' gradients
  // accumulate (call the optimizer's zero_grad() first, as before loss.backward()).
  // The stages run in the caller's autocast state (Note [What a device thread inherits]);
  // loss_scale multiplies every micro-batch's loss before its backward, as
  // GradScaler::scale(loss).backward() would (result.loss stays unscaled).
  StepResult step(const Tensor& input, const Tensor& target, double loss_scale = 1.0) override;

  int64_t n_microbatches() const { return n_microbatches_; }
  // S: the pipeline's stages (devices, threads); stages() holds their S·V virtual stages.
  const std::vector<Device>& stage_devices() const { return stage_devices_; }
  int64_t virtual_stages() const { return virtual_stages_; }
  const std::string& schedule_name() const { return schedule_name_; }
  const std::string& checkpoint() const { return checkpoint_; }
  std::string extra_repr() const override;

 private:
  std::vector<Device> stage_devices_;
  int64_t virtual_stages_ = 1;
  int64_t n_microbatches_;
  std::string schedule_name_;
  LossFn loss_fn_;
  std::string checkpoint_;
};

}  // namespace loom::parallel::pipeline
