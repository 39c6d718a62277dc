#include "parallel/pipeline/pipeline.h"

#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>  // defines: std::exchange

#include "autograd/grad_mode.h"  // defines: GradMode
#include "core/error.h"
#include "core/trace.h"          // defines: trace::Span (each action is a span on its stage's row)
#include "parallel/device_threads.h"  // defines: run_on_device_threads, CallerState, DeviceScope
#include "parallel/pipeline/microbatch_runner.h"  // defines: MicrobatchRunner, action_name

namespace loom::parallel::pipeline {

// The device of each virtual stage: virtual stage c on devices[c % S] (Note [Interleaved
// 1F1B: virtual stages]); the devices as they are but for interleaved_1f1b.
static std::vector<Device> virtual_stage_devices(const std::vector<Device>& devices, size_t balance_size,
                                         const std::string& schedule) {
  if (schedule != "interleaved_1f1b" || devices.empty()) return devices;
  LOOM_CHECK(balance_size % devices.size() == 0 && balance_size > 0, "Pipeline: interleaved_1f1b needs S×V entries "
             "in the balance (V virtual stages on each of the ", devices.size(), " devices), got ", balance_size);
  std::vector<Device> out;
  for (size_t c = 0; c < balance_size; ++c) out.push_back(devices[c % devices.size()]);
  return out;
}

Pipeline::Pipeline(std::shared_ptr<nn::Sequential> module, std::vector<Device> devices, std::vector<int64_t> balance,
                   int64_t n_microbatches, std::string schedule, LossFn loss_fn, std::string checkpoint)
    : ModelParallel("Pipeline", std::move(module), virtual_stage_devices(devices, balance.size(), schedule),
                    balance),  // a copy: the arguments' order of evaluation is unspecified
      stage_devices_(std::move(devices)),
      n_microbatches_(n_microbatches),
      schedule_name_(std::move(schedule)),
      loss_fn_(std::move(loss_fn)),
      checkpoint_(std::move(checkpoint)) {
  LOOM_CHECK(n_microbatches_ >= 1, "Pipeline: n_microbatches must be at least 1, got ", n_microbatches_);
  LOOM_CHECK(loss_fn_ != nullptr, "Pipeline: no loss function");
  LOOM_CHECK(checkpoint_ == "never" || checkpoint_ == "except_last" || checkpoint_ == "always",
             "Pipeline: checkpoint must be 'never', 'except_last' or 'always' (torchgpipe's), got '", checkpoint_, "'");
  check_schedule_name(schedule_name_);
  virtual_stages_ = static_cast<int64_t>(stages().size() / stage_devices_.size());
  make_schedule(schedule_name_, static_cast<int64_t>(stage_devices_.size()), n_microbatches_, virtual_stages_);
}

Pipeline::StepResult Pipeline::step(const Tensor& input, const Tensor& target, double loss_scale) {
  LOOM_CHECK(GradMode::is_enabled(), "Pipeline::step trains: it runs forward and backward, so it needs grad mode on "
             "(it was called under NoGradGuard). To evaluate, call the pipeline as a module: pipe(input)");
  LOOM_CHECK(input.defined() && target.defined() && input.dim() > 0 && target.dim() > 0 &&
                 input.size(0) == target.size(0) && input.size(0) > 0,
             "Pipeline::step: expected an input and a target with the same positive batch size, got ", input.str(),
             " and ", target.str());
  LOOM_CHECK(std::isfinite(loss_scale) && loss_scale > 0, "Pipeline::step: loss_scale must be a positive finite "
             "number (GradScaler's scale), got ", loss_scale);
  const auto S = static_cast<int64_t>(stage_devices_.size()), C = static_cast<int64_t>(stages().size());
  std::vector<MicrobatchRunner::VirtualStage> virtual_stages;
  for (int64_t c = 0; c < C; ++c) virtual_stages.push_back({stages()[size_t(c)].get(), devices()[size_t(c)]});
  MicrobatchRunner run(std::move(virtual_stages), S, loss_fn_, input.size(0), n_microbatches_, input, target,
                       loss_scale, checkpoint_);
  const int64_t M = run.n_microbatches();
  const Schedule schedule = make_schedule(schedule_name_, S, M, virtual_stages_);

  // What the virtual stages hand each other, as device copies (Note [One graph per
  // virtual stage and micro-batch]): activations[c][m] is c's output for c + 1,
  // gradients[c][m] the gradient of c's input for c - 1; written by c's thread, taken by
  // the neighbour's once the done flag says it is there.
  std::vector<std::vector<Tensor>> activations(static_cast<size_t>(C), std::vector<Tensor>(static_cast<size_t>(M)));
  std::vector<std::vector<Tensor>> gradients(static_cast<size_t>(C), std::vector<Tensor>(static_cast<size_t>(M)));
  auto act = [&](int64_t c, const Action& a) {
    const auto m = size_t(a.micro_batch);
    if (a.pass == Pass::Forward) {
      Tensor x = c == 0 ? Tensor() : std::exchange(activations[size_t(c) - 1][m], Tensor());
      activations[size_t(c)][m] = run.forward(c, a.micro_batch, x);
    } else {
      Tensor g = c == C - 1 ? Tensor() : std::exchange(gradients[size_t(c) + 1][m], Tensor());
      gradients[size_t(c)][m] = run.backward(c, a.micro_batch, g);
    }
  };

  std::vector<std::exception_ptr> errors(static_cast<size_t>(S));
  std::vector<std::string> where(static_cast<size_t>(S));
  // See Note [Stages wait only for what they need]. done[pass][c][m], under `mutex`.
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::vector<std::vector<char>>> done(
      2, std::vector<std::vector<char>>(size_t(C), std::vector<char>(size_t(M), 0)));
  bool failed = false;
  auto ready = [&](int64_t c, const Action& a) {
    const auto m = size_t(a.micro_batch);
    if (a.pass == Pass::Forward) return c == 0 || done[0][size_t(c) - 1][m] != 0;
    return c == C - 1 ? done[0][size_t(c)][m] != 0 : done[1][size_t(c) + 1][m] != 0;
  };
  auto fail = [&](size_t stage, std::string what) {
    errors[stage] = std::current_exception();
    where[stage] = std::move(what);
    std::lock_guard<std::mutex> lock(mutex);
    failed = true;
    changed.notify_all();  // the others stop waiting: nothing hangs
  };
  const CallerState caller = CallerState::capture(size_t(S));  // Note [What a device thread inherits]
  run_on_device_threads(size_t(S), [&](size_t stage) {
    const auto s = static_cast<int64_t>(stage);
    std::optional<DeviceScope> scope;
    try {
      scope.emplace(caller, stage_devices_[stage]);
    } catch (...) {  // a GPU that cannot be made current
      return fail(stage, "set-up of its thread");
    }
    // Stage 0 runs on the caller's thread, which keeps its name; the others are named.
    if (stage > 0 && trace::enabled()) trace::set_thread_name(detail::str("stage ", s));
    for (size_t tick = 0; tick < schedule.ticks.size(); ++tick) {  // this stage's order
      const auto& action = schedule.ticks[tick][stage];
      if (!action) continue;
      const int64_t c = virtual_stage(s, action->local_stage, S);
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return failed || ready(c, *action); });
        if (failed) return;
      }
      try {
        trace::Span span(action_name(*action, s, S, virtual_stages_), "pipeline");
        act(c, *action);
      } catch (...) {
        return fail(stage, detail::str(action->pass == Pass::Forward ? "forward" : "backward", " of micro-batch ",
                                       action->micro_batch,
                                       virtual_stages_ > 1 ? detail::str(" on virtual stage ", c) : std::string(),
                                       " (its action at tick ", tick, " of the schedule)"));
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        done[size_t(action->pass)][size_t(c)][size_t(action->micro_batch)] = 1;
      }
      changed.notify_all();
    }
  });
  rethrow_first_error(errors, [&](size_t s) {
    return detail::str("Pipeline: stage ", s, " (", stage_devices_[s], ") failed in the ", where[s]);
  });
  run.check_recomputed_exactly();
  return {run.loss(), run.output()};
}

std::string Pipeline::extra_repr() const {
  return ModelParallel::extra_repr() + ", n_microbatches=" + std::to_string(n_microbatches_) + ", schedule=" + schedule_name_ +
         (virtual_stages_ > 1 ? ", virtual_stages=" + std::to_string(virtual_stages_) : std::string()) +
         ", checkpoint=" + checkpoint_;
}

}  // namespace loom::parallel::pipeline
