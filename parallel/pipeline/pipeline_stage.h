// Pipeline stages as processes: each rank of a pipeline group holds its stage's virtual
// stages (one, or V under interleaved 1F1B) and runs its row of the same pure schedule
// the in-process Pipeline runs (parallel/pipeline/schedule.h), exchanging activations
// and gradients with its neighbours by send / recv. PyTorch's torch.distributed.
// pipelining: its PipelineStage and its schedules (ScheduleGPipe, Schedule1F1B,
// ScheduleInterleaved1F1B) in one class, since loom's schedules are data.
//
//   // On every rank of `group` (its rank = the stage), the same model and balance:
//   auto seq = nn::resnet18(10)->sequential();
//   parallel::pipeline::PipelineStage stage(seq, {7, 7}, group, Device("cpu"), /*n_microbatches=*/4, "1f1b",
//                                           [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); });
//   optim::SGD opt(stage.parameters(), {.lr = 0.1});     // this rank's parameters only
//   opt.zero_grad();
//   auto r = stage.step(images, labels);  // every rank passes the batch; r.loss on every rank
//   opt.step();
//
// Note [Stages as processes]
// Virtual stage c (of S·V, balance[c] layers each) lives on rank c % S (Note [Interleaved
// 1F1B: virtual stages]; V = 1: stage c on rank c). Rank s runs its row of the schedule
// in order; for each action:
//   forward of (c, m):  its input is micro-batch m of the batch (c = 0) or a recv from
//                       rank s - 1 (mod S); its output is sent to rank s + 1 (mod S), or,
//                       on the last virtual stage, goes into the loss;
//   backward of (c, m): the output's gradient is a recv from rank s + 1 (the last one:
//                       the weighted loss's backward); the input's gradient is sent to
//                       rank s - 1.
// Activations travel on one tag and gradients on another, matched by call order: every
// rank's schedule sends them in the order its neighbour receives them (schedule tests:
// "messages in order"). Sends are asynchronous and waited for only at the end of the
// step, so a stage computes its next micro-batch while the last send is in flight; the
// next receive on each tag is posted ahead (as soon as its shape is known), so the data
// lands while the stage computes. Each action is MicrobatchRunner's, as in the in-process
// Pipeline (Note [One graph per virtual stage and micro-batch], microbatch_runner.h):
// the same ops in the same order, gradients accumulated in micro-batch order, so the
// weights after any number of steps are bitwise those of Pipeline with the same balance,
// micro-batches and schedule (tests/test_pipeline_stage.cpp).
//
// Note [Shapes are agreed once]
// A receiver must post a buffer of the sender's dtype and shape. At the first step, the
// first activation from each virtual stage is preceded by a small header (dtype and the
// per-sample shape); both ranks keep it. Later activations are [micro-batch size] +
// that shape, and the sender checks every output against it before sending: a stage
// whose output shape changed is a clear error on that stage (and the transport checks
// every message's dtype and shape again at the receiver). Gradients have the shape of
// the output they belong to, which the receiving stage computed itself. Every rank
// derives the micro-batch sizes from the batch size (micro_batch_sizes).
//
// Note [A failed stage stops the pipeline]
// A stage that throws must not leave its neighbours waiting for messages that will never
// come, nor blocked sending messages it will never receive. So the failing rank (1)
// posts every receive its schedule still expected (their messages are dropped), which
// completes its neighbours' sends; (2) sends a small abort message to rank s + 1 on the
// activation tag and to rank s - 1 on the gradient tag: the neighbour waiting for this
// rank's next message gets it instead, which fails that receive at once (the transport
// refuses a message of another shape); that rank then does the same, so the stop spreads
// along the pipeline. (3) Every rank, failed or not, ends each step with one all-reduce
// of its status (and the loss): so every rank learns which stage
// failed first, in which pass and micro-batch, and throws an error naming it. A rank
// that dies instead is noticed by its neighbours' transport (or the communicator's
// timeout) and loomrun stops the job. After a failed step the group's messages are out
// of step: the stage refuses further steps (recreate the group, as after a timeout).
//
// Note [A replicated stage synchronises once]
// Under pp x dp every stage has replicas on other pipelines, which must average their
// gradients, as DDP's do. A virtual stage runs one backward per micro-batch, and its
// gradients are complete only after the last: averaging after each would cost M
// all-reduces per step for the result of one. So, as PyTorch's pipelining does with a
// DDP stage (no_sync for every backward but the last), the earlier backwards accumulate
// locally and only the virtual stage's last backward of the step arms the DDP reducer:
// its gradient hooks then all-reduce the accumulated gradients bucket by bucket while
// that backward is still running, and the rest of the schedule (other virtual stages)
// overlaps what it cannot hide.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/container.h"                  // defines: nn::Sequential
#include "parallel/comm/communicator.h"   // defines: distributed::Communicator
#include "parallel/pipeline/step_result.h"  // defines: StepResult

namespace loom::parallel::pipeline {

class PipelineStage : public nn::Module, public PipelineSchedule {
 public:
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;

  // module: the whole model as a Sequential, built alike on every rank; balance: layers
  // per virtual stage, S entries (S×V for interleaved_1f1b), summing to the Sequential's
  // length; group: the pipeline's ranks, rank s = stage s; device: where this rank's
  // virtual stages run (their layers move there). n_microbatches: micro-batches per
  // batch; schedule: "gpipe", "1f1b" or "interleaved_1f1b". A collective: every rank of
  // `group` constructs its PipelineStage together, and the ranks check that they agree
  // on the balance, micro-batches and schedule (a clear error on every rank if not).
  PipelineStage(std::shared_ptr<nn::Sequential> module, std::vector<int64_t> balance,
                std::shared_ptr<distributed::Communicator> group, Device device, int64_t n_microbatches,
                std::string schedule, LossFn loss_fn);

  // The batch's loss on every rank (all-reduced), the outputs where the last stage runs.
  using StepResult = ::loom::parallel::pipeline::StepResult;
  // Forward and backward of one batch under the schedule; this rank's parameters'
  // gradients accumulate (zero_grad first). Every rank passes the batch: the first stage
  // reads the input, the last the target, all of them its size (a middle stage may pass
  // only one of the two). loss_scale multiplies every micro-batch's loss before its
  // backward (GradScaler's scale). A collective over the group.
  StepResult step(const Tensor& input, const Tensor& target, double loss_scale = 1.0) override;

  // Data parallelism over this stage's replicas (2-D: pp x dp). after_step runs at the
  // end of every step that succeeded (DDP: broadcast rank 0's buffers, so that replicas
  // evaluate and start the next step alike, as DDP's forward would make them);
  // before_backward before each backward
  // of one of this rank's virtual stages (its index in local_virtual_stages()), saying whether it
  // is that virtual stage's last backward of the step. See Note [A replicated stage
  // synchronises once].
  struct GradientSync {
    std::function<void()> after_step;
    std::function<void(size_t local_stage, bool last_backward)> before_backward;
  };
  void set_gradient_sync(GradientSync sync) { sync_ = std::move(sync); }

  // Recompute micro-batches' activations in their backward instead of keeping them:
  // "never", "except_last" or "always", as Pipeline's checkpoint (torchgpipe's; Note
  // [Checkpointed micro-batches are recomputed exactly], pipeline.h), on this rank's
  // virtual stages. Bitwise the same training; a loom::Error for any other word.
  void set_checkpoint(std::string checkpoint);
  const std::string& checkpoint() const { return checkpoint_; }
  // From now on this rank's virtual stage `local_stage` (its index in local_virtual_stages()) runs
  // through `wrapper`, a module that holds its Sequential and runs it: FSDP, which
  // gathers its parameters first (stage_sharding.h). The wrapper takes the Sequential's
  // place among the stage's submodules, so parameters() are the wrapper's (FSDP's
  // shards, the ones the optimizer steps) and local_virtual_stages() still gives the Sequential.
  void wrap_virtual_stage(size_t local_stage, std::shared_ptr<nn::Module> wrapper);

  // After it, every rank's module holds every virtual stage's parameters and buffers as
  // the rank that trains it has them (one broadcast per tensor, from its owner):
  // for evaluating or saving the whole model on any rank. A collective over the group.
  void share_weights();

  int64_t stage_index() const { return stage_; }
  int64_t num_stages() const { return stages_; }
  int64_t virtual_stages() const { return virtual_stages_; }
  int64_t n_microbatches() const { return n_microbatches_; }
  const std::string& schedule_name() const { return schedule_name_; }
  const std::vector<int64_t>& balance() const { return balance_; }
  const Device& device() const { return device_; }
  // The pipeline group: its rank is this stage.
  const std::shared_ptr<distributed::Communicator>& group() const { return group_; }
  // This rank's virtual stages' Sequentials (V of them): virtual stages stage, stage + S,
  // ... (the name is the one stage_sharding and the trainer call).
  std::vector<std::shared_ptr<nn::Sequential>> local_virtual_stages() const;
  bool is_first() const { return stage_ == 0; }                 // holds the model's first virtual stage
  bool is_last() const { return stage_ == stages_ - 1; }         // holds the model's last (the loss)
  std::string extra_repr() const override;

 private:
  struct Run;  // one step's state (pipeline_stage.cpp)
  friend struct Run;
  // Dtype and per-sample shape of virtual stage c's output: Note [Shapes are agreed once].
  struct Agreed {
    DType dtype = DType::Float32;
    Shape sample;
    bool channels_last = false;  // Note [Activations keep their memory format between stages]
  };
  void agree_on_settings();

  std::shared_ptr<distributed::Communicator> group_;
  Device device_;
  std::vector<int64_t> balance_;
  int64_t n_microbatches_;
  std::string schedule_name_;
  LossFn loss_fn_;
  int64_t stage_ = 0, stages_ = 1, virtual_stages_ = 1;
  std::vector<std::shared_ptr<nn::Sequential>> virtual_stage_layers_;  // all S·V; this rank's are on device_
  std::vector<std::shared_ptr<nn::Module>> wrappers_;  // [virtual stage]: what runs it (wrap_virtual_stage); null: its layers
  std::map<int64_t, Agreed> agreed_;  // by the virtual stage whose output it is
  std::string broken_;                // why an earlier step failed; "" if none did
  GradientSync sync_;
  std::string checkpoint_ = "never";
};

// Whether `module` has a parameter that requires grad. A virtual stage without one (a
// pooling layer cut off alone, say) is left unwrapped by shard_stage and replicate_stage:
// FSDP would have nothing to shard and DDP nothing to reduce.
bool has_trainable_parameters(const nn::Module& module);

}  // namespace loom::parallel::pipeline
