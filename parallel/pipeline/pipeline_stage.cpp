#include "parallel/pipeline/pipeline_stage.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <optional>

#include "autograd/grad_mode.h"           // defines: GradMode
#include "core/error.h"
#include "core/factory.h"                 // defines: from_vector, empty, zeros
#include "core/trace.h"                   // defines: trace::Span (each action a span, as in one process)
#include "parallel/model_parallel.h"      // defines: split_module
#include "parallel/pipeline/microbatch_runner.h"  // defines: MicrobatchRunner, micro_batch_sizes, action_name,
                                                  // virtual_stage_name
#include "parallel/pipeline/schedule.h"   // defines: make_schedule, virtual_stage

namespace loom::parallel::pipeline {
namespace {

constexpr int64_t kMaxBalance = 64;   // entries compared at construction

int64_t schedule_code(const std::string& s) { return s == "gpipe" ? 1 : s == "1f1b" ? 2 : s == "interleaved_1f1b" ? 3 : 0; }

std::string describe_settings(const std::vector<int64_t>& row) {
  static const char* names[] = {"an unknown schedule", "gpipe", "1f1b", "interleaved_1f1b"};
  std::string balance = "[";
  for (int64_t i = 0; i < std::min(row[0], kMaxBalance); ++i) balance += (i ? ", " : "") + std::to_string(row[size_t(4 + i)]);
  if (row[0] > kMaxBalance) balance += ", ...";
  return detail::str("balance ", balance, "], n_microbatches ", row[1], ", schedule ", names[std::clamp<int64_t>(row[2], 0, 3)]);
}

}  // namespace

PipelineStage::PipelineStage(std::shared_ptr<nn::Sequential> module, std::vector<int64_t> balance,
                             std::shared_ptr<distributed::Communicator> group, Device device, int64_t n_microbatches,
                             std::string schedule, LossFn loss_fn)
    : nn::Module("PipelineStage"),
      group_(std::move(group)),
      device_(device),
      balance_(std::move(balance)),
      n_microbatches_(n_microbatches),
      schedule_name_(std::move(schedule)),
      loss_fn_(std::move(loss_fn)) {
  LOOM_CHECK(group_ != nullptr, "PipelineStage: the pipeline group is null");
  stage_ = group_->rank();
  stages_ = group_->size();
  // First the collective, so that a rank with other settings is an error on every rank
  // (before any rank's local check could leave the others waiting in it).
  agree_on_settings();
  LOOM_CHECK(module != nullptr, "PipelineStage: the module is null");
  LOOM_CHECK(stages_ >= 2, "PipelineStage: a pipeline group of one rank has no neighbours to exchange with; run the "
             "stages in one process (parallel::pipeline::Pipeline) or use a group of at least 2 ranks");
  check_schedule_name(schedule_name_);
  LOOM_CHECK(n_microbatches_ >= 1, "PipelineStage: n_microbatches must be at least 1, got ", n_microbatches_);
  LOOM_CHECK(loss_fn_ != nullptr, "PipelineStage: no loss function");
  const auto entries = static_cast<int64_t>(balance_.size());
  LOOM_CHECK(entries > 0 && entries % stages_ == 0, "PipelineStage: the balance has ", entries, " entries for a "
             "pipeline of ", stages_, " stages; give one per stage (", stages_, ") or, with interleaved_1f1b, S×V (",
             stages_, "×V virtual stages)");
  virtual_stages_ = entries / stages_;
  LOOM_CHECK(virtual_stages_ == 1 || schedule_name_ == "interleaved_1f1b", "PipelineStage: a balance of ", entries,
             " entries is ", virtual_stages_, " virtual stages on each of the ", stages_, " stages, which only "
             "interleaved_1f1b runs; ", schedule_name_, " needs ", stages_, " entries");
  virtual_stage_layers_ = split_module(*module, balance_);  // a wrong sum is an error naming the Sequential's length
  wrappers_.resize(virtual_stage_layers_.size());
  for (int64_t v = 0; v < virtual_stages_; ++v) {
    const int64_t c = virtual_stage(stage_, v, stages_);
    virtual_stage_layers_[size_t(c)]->to(device_);
    register_module(std::to_string(c), virtual_stage_layers_[size_t(c)]);
  }
}

// One all_gather of (entries, micro-batches, schedule, balance): Note [A failed stage stops
// the pipeline] needs every rank to run the same schedule over the same virtual stages.
void PipelineStage::agree_on_settings() {
  std::vector<int64_t> mine(size_t(4 + kMaxBalance), 0);
  mine[0] = static_cast<int64_t>(balance_.size());
  mine[1] = n_microbatches_;
  mine[2] = schedule_code(schedule_name_);
  for (size_t i = 0; i < std::min<size_t>(balance_.size(), size_t(kMaxBalance)); ++i) mine[4 + i] = balance_[i];
  Tensor local = distributed::to_communication_device(from_vector(mine, {int64_t(mine.size())}), *group_);
  std::vector<Tensor> all;
  group_->all_gather(all, local)->wait();
  for (int r = 0; r < stages_; ++r) {
    const std::vector<int64_t> theirs = all[size_t(r)].tolist<int64_t>();
    LOOM_CHECK(theirs == mine, "PipelineStage: the ranks of the pipeline group disagree on the pipeline: rank ",
               stage_, " has ", describe_settings(mine), " but rank ", r, " has ", describe_settings(theirs),
               ". Every stage must be built with the same balance, micro-batches and schedule (and so the same "
               "number of virtual stages)");
  }
}

void PipelineStage::wrap_virtual_stage(size_t local_stage, std::shared_ptr<nn::Module> wrapper) {
  LOOM_CHECK(static_cast<int64_t>(local_stage) < virtual_stages_ && wrapper != nullptr, "PipelineStage::wrap_virtual_stage: "
             "expected a module for one of this stage's ", virtual_stages_, " virtual stages, got ",
             wrapper ? "" : "a null module for ", "its virtual stage ", local_stage, " (local index)");
  const int64_t c = virtual_stage(stage_, static_cast<int64_t>(local_stage), stages_);
  register_module(std::to_string(c), wrapper);  // replaces the layers: parameters() are the wrapper's
  wrappers_[size_t(c)] = std::move(wrapper);
}

void PipelineStage::share_weights() {
  for (int64_t v = 0; v < virtual_stages_; ++v) {
    const auto& wrapper = wrappers_[size_t(virtual_stage(stage_, v, stages_))];
    LOOM_CHECK(!wrapper, "PipelineStage::share_weights: ", virtual_stage_name(virtual_stage(stage_, v, stages_),
               stages_, virtual_stages_), " runs through a ", wrapper ? wrapper->type_name() : "", " (wrap_virtual_stage), "
               "whose parameters are not its layers' own between steps; gather them through the wrapper "
               "(fsdp::full_state_dict) instead");
  }
  NoGradGuard no_grad;
  for (int64_t c = 0; c < static_cast<int64_t>(virtual_stage_layers_.size()); ++c) {
    const int owner = static_cast<int>(c % stages_);
    for (const Tensor& t : virtual_stage_layers_[size_t(c)]->state_dict().values()) {
      Tensor buffer = t.detach().contiguous().to(group_->tensor_device());  // t itself, where it can be
      group_->broadcast(buffer, owner)->wait();
      if (owner != stage_ && buffer.raw_data() != t.raw_data()) Tensor(t).copy_(buffer.to(t.device()));
    }
  }
}

std::vector<std::shared_ptr<nn::Sequential>> PipelineStage::local_virtual_stages() const {
  std::vector<std::shared_ptr<nn::Sequential>> out;
  for (int64_t v = 0; v < virtual_stages_; ++v)
    out.push_back(virtual_stage_layers_[size_t(virtual_stage(stage_, v, stages_))]);
  return out;
}

std::string PipelineStage::extra_repr() const {
  // "stage=1 of 2, 7 layers on cpu, ...", with V > 1 "stage=1 of 2, virtual_stages=[1: 4
  // layers, 3: 3 layers] on cpu, ...".
  std::string out = detail::str("stage=", stage_, " of ", stages_, ", ");
  if (virtual_stages_ == 1) {
    out += detail::str(balance_[size_t(stage_)], " layers");
  } else {
    out += "virtual_stages=[";
    for (int64_t v = 0; v < virtual_stages_; ++v) {
      const int64_t c = virtual_stage(stage_, v, stages_);
      out += detail::str(v ? ", " : "", c, ": ", balance_[size_t(c)], " layers");
    }
    out += "]";
  }
  return out + detail::str(" on ", device_.str(), ", n_microbatches=", n_microbatches_, ", schedule=", schedule_name_);
}

void PipelineStage::set_checkpoint(std::string checkpoint) {
  LOOM_CHECK(checkpoint == "never" || checkpoint == "except_last" || checkpoint == "always", "PipelineStage: "
             "checkpoint must be 'never', 'except_last' or 'always' (torchgpipe's), got '", checkpoint, "'");
  checkpoint_ = std::move(checkpoint);
}

bool has_trainable_parameters(const nn::Module& module) {
  for (const Tensor& p : module.parameters())
    if (p.requires_grad()) return true;
  return false;
}

}  // namespace loom::parallel::pipeline
