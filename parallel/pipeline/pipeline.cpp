#include "parallel/pipeline/pipeline.h"

#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>

#include "autograd/grad_mode.h"  // defines: GradMode
#include "autograd/ops.h"        // defines: chunk, cat
#include "core/error.h"
#include "core/generator.h"      // defines: default_generator
#include "core/trace.h"          // defines: trace::Span (each action is a span on its stage's row)
#include "nn/activation.h"       // defines: nn::Dropout
#include "parallel/device_threads.h"  // defines: run_on_device_threads, CallerState, DeviceScope

namespace loom::parallel::pipeline {

// The device of each model chunk: chunk c on devices[c % S] (Note [Interleaved 1F1B:
// virtual stages]); the devices as they are but for interleaved_1f1b.
static std::vector<Device> chunk_devices(const std::vector<Device>& devices, size_t balance_size,
                                         const std::string& schedule) {
  if (schedule != "interleaved_1f1b" || devices.empty()) return devices;
  LOOM_CHECK(balance_size % devices.size() == 0 && balance_size > 0, "Pipeline: interleaved_1f1b needs S×V entries "
             "in the balance (V model chunks on each of the ", devices.size(), " devices), got ", balance_size);
  std::vector<Device> out;
  for (size_t c = 0; c < balance_size; ++c) out.push_back(devices[c % devices.size()]);
  return out;
}

Pipeline::Pipeline(std::shared_ptr<nn::Sequential> module, std::vector<Device> devices, std::vector<int64_t> balance,
                   int64_t chunks, std::string schedule, LossFn loss_fn, std::string checkpoint)
    : ModelParallel("Pipeline", std::move(module), chunk_devices(devices, balance.size(), schedule),
                    balance),  // a copy: the arguments' order of evaluation is unspecified
      stage_devices_(std::move(devices)),
      chunks_(chunks),
      schedule_name_(std::move(schedule)),
      loss_fn_(std::move(loss_fn)),
      checkpoint_(std::move(checkpoint)) {
  LOOM_CHECK(chunks_ >= 1, "Pipeline: chunks must be at least 1, got ", chunks_);
  LOOM_CHECK(loss_fn_ != nullptr, "Pipeline: no loss function");
  LOOM_CHECK(checkpoint_ == "never" || checkpoint_ == "except_last" || checkpoint_ == "always",
             "Pipeline: checkpoint must be 'never', 'except_last' or 'always' (torchgpipe's), got '", checkpoint_, "'");
  check_schedule_name(schedule_name_);
  virtual_stages_ = static_cast<int64_t>(stages().size() / stage_devices_.size());
  make_schedule(schedule_name_, static_cast<int64_t>(stage_devices_.size()), chunks_, virtual_stages_);
}

bool Pipeline::checkpointed(int64_t m, int64_t M) const {
  return checkpoint_ == "always" || (checkpoint_ == "except_last" && m < M - 1);
}

namespace {

// Puts a stage's buffers (BatchNorm's running statistics) back as they were when it was
// made, however its scope ends (a recomputation that throws included): see Note
// [Checkpointed micro-batches are recomputed exactly].
class RestoreBuffers {
 public:
  explicit RestoreBuffers(const nn::Module& stage) : buffers_(stage.named_buffers().values()) {
    for (const Tensor& b : buffers_) copies_.push_back(b.clone());
  }
  ~RestoreBuffers() {
    NoGradGuard no_grad;
    for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(copies_[i]);
  }
  RestoreBuffers(const RestoreBuffers&) = delete;
  RestoreBuffers& operator=(const RestoreBuffers&) = delete;

 private:
  std::vector<Tensor> buffers_, copies_;
};

// The first Dropout of `stage` that would draw a mask (p > 0, training), named and
// printed ("'1': Dropout(p=0.5)"), or "".
std::string random_layer(nn::Module& stage) {
  for (const auto& [name, module] : stage.named_modules()) {
    const auto* dropout = dynamic_cast<const nn::Dropout*>(module.get());
    if (dropout && dropout->p > 0 && dropout->is_training()) return detail::str("'", name, "': ", dropout->str());
  }
  return "";
}

// What one step's stages hand each other; element [s][m] is written by stage s's thread
// (or, for a consumed input, by stage s - 1's) at the tick of the action that makes it.
struct StepState {
  std::vector<std::vector<Tensor>> inputs;   // [s][m]: stage s's input leaf (s > 0; s = 0 if checkpointed)
  std::vector<std::vector<Tensor>> outputs;  // [s][m]: stage s's output (the weighted loss on the last stage)
  std::vector<Tensor> losses, logits;        // [m]: detached, from the last stage
};

}  // namespace

Pipeline::StepResult Pipeline::step(const Tensor& input, const Tensor& target, double loss_scale) {
  LOOM_CHECK(GradMode::is_enabled(), "Pipeline::step trains: it runs forward and backward, so it needs grad mode on "
             "(it was called under NoGradGuard). To evaluate, call the pipeline as a module: pipe(input)");
  const auto& stage_modules = stages();  // the model's chunks: S·V of them
  const auto S = static_cast<int64_t>(stage_devices_.size()), C = static_cast<int64_t>(stage_modules.size());
  LOOM_CHECK(input.defined() && target.defined() && input.dim() > 0 && target.dim() > 0 &&
                 input.size(0) == target.size(0) && input.size(0) > 0,
             "Pipeline::step: expected an input and a target with the same positive batch size, got ", input.str(),
             " and ", target.str());
  LOOM_CHECK(std::isfinite(loss_scale) && loss_scale > 0, "Pipeline::step: loss_scale must be a positive finite "
             "number (GradScaler's scale), got ", loss_scale);
  const double batch = static_cast<double>(input.size(0));
  std::vector<Tensor> micro_inputs = chunk(input.detach(), chunks_, 0);
  std::vector<Tensor> micro_targets = chunk(target, chunks_, 0);
  const auto M = static_cast<int64_t>(micro_inputs.size());
  const Schedule schedule = make_schedule(schedule_name_, S, M, virtual_stages_);

  StepState st;
  st.inputs.resize(size_t(C));
  st.outputs.resize(size_t(C));
  for (int64_t c = 0; c < C; ++c) {
    st.inputs[size_t(c)].resize(size_t(M));
    st.outputs[size_t(c)].resize(size_t(M));
  }
  // Whether any micro-batch is recomputed (the first is, if any is), and the default
  // generator's position before: Note [Checkpointed micro-batches are recomputed exactly].
  const bool recomputes = checkpointed(0, M);
  for (int64_t c = 0; recomputes && c < C; ++c) {
    const std::string layer = random_layer(*stage_modules[size_t(c)]);
    LOOM_CHECK(layer.empty(), "Pipeline: ", chunk_name(c), " has a Dropout in training mode (", layer, "), which draws a "
               "new mask when checkpoint='", checkpoint_, "' recomputes its forward, so the gradients would not be "
               "this step's. Use checkpoint='never' (train_cifar10 --pipeline-checkpoint never), or put the "
               "module in eval mode");
  }
  const uint64_t random_offset = default_generator().offset();
  st.losses.resize(size_t(M));
  st.logits.resize(size_t(M));

  // See Note [Stages wait only for what they need]. In these lambdas `s` is a model
  // chunk (0 .. C - 1): a stage when V = 1; Note [Interleaved 1F1B: virtual stages].
  // The chunk's forward of micro-batch m; on the last chunk also the (weighted, scaled) loss.
  auto run_stage = [&](int64_t s, int64_t m, const Tensor& x) {
    Tensor y = (*stage_modules[size_t(s)])(x);
    if (s == C - 1) {
      const Tensor& t = micro_targets[size_t(m)];
      // Note [Micro-batch losses add up to the batch's]
      Tensor loss = loss_fn_(y, t.to(y.device())) * (static_cast<double>(t.size(0)) / batch);
      st.losses[size_t(m)] = loss.detach();
      st.logits[size_t(m)] = y.detach();
      y = loss_scale == 1.0 ? loss : loss * loss_scale;  // GradScaler's scale under fp16
    }
    return y;
  };
  auto forward = [&](int64_t s, int64_t m) {
    Tensor x = s == 0 ? micro_inputs[size_t(m)] : st.outputs[size_t(s) - 1][size_t(m)].detach();
    x = x.to(devices()[size_t(s)]);
    if (s > 0) x = x.detach().requires_grad_(true);  // a leaf: its .grad() is what stage s - 1 needs
    if (s > 0 || checkpointed(m, M)) st.inputs[size_t(s)][size_t(m)] = x;
    if (!checkpointed(m, M)) {
      st.outputs[size_t(s)][size_t(m)] = run_stage(s, m, x);
      return;
    }
    // See Note [Checkpointed micro-batches are recomputed exactly].
    if (s > 0) st.outputs[size_t(s) - 1][size_t(m)] = Tensor();  // recomputed by stage s - 1's backward
    NoGradGuard no_graph;
    st.outputs[size_t(s)][size_t(m)] = run_stage(s, m, x);
  };
  auto recompute = [&](int64_t s, int64_t m) {
    trace::Span span("recompute", "pipeline");  // inside its backward's span: the price of checkpointing, drawn
    {
      RestoreBuffers undo(*stage_modules[size_t(s)]);  // the recomputation's update of the running statistics
      st.outputs[size_t(s)][size_t(m)] = run_stage(s, m, st.inputs[size_t(s)][size_t(m)]);
    }
    if (s == 0) st.inputs[0][size_t(m)] = Tensor();
  };
  auto backward = [&](int64_t s, int64_t m) {
    if (checkpointed(m, M)) recompute(s, m);
    Tensor& out = st.outputs[size_t(s)][size_t(m)];
    if (s == C - 1) {
      out.backward();
    } else {
      Tensor& next_input = st.inputs[size_t(s) + 1][size_t(m)];
      Tensor grad = next_input.grad();
      LOOM_CHECK(grad.defined(), "Pipeline: ", chunk_name(s + 1), " left no gradient for its input of micro-batch ", m,
                 "; does its first layer use its input?");
      if (out.requires_grad()) out.backward(grad.to(out.device()));
      next_input = Tensor();  // stage s + 1 is done with micro-batch m
    }
    out = Tensor();  // frees this micro-batch's graph on stage s
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
  const CallerState caller = CallerState::capture(size_t(S));  // Note [What a device thread inherits]
  run_on_device_threads(size_t(S), [&](size_t stage) {
    const auto s = static_cast<int64_t>(stage);
    std::optional<DeviceScope> scope;
    try {
      scope.emplace(caller, stage_devices_[stage]);
    } catch (...) {  // a GPU that cannot be made current
      errors[stage] = std::current_exception();
      where[stage] = "set-up of its thread";
      std::lock_guard<std::mutex> lock(mutex);
      failed = true;
      changed.notify_all();
      return;
    }
    // Stage 0 runs on the caller's thread, which keeps its name; the others are named.
    if (stage > 0 && trace::enabled()) trace::set_thread_name(detail::str("stage ", s));
    for (size_t tick = 0; tick < schedule.ticks.size(); ++tick) {  // this stage's order
      const auto& action = schedule.ticks[tick][stage];
      if (!action) continue;
      const int64_t c = model_chunk(s, action->chunk, S);
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return failed || ready(c, *action); });
        if (failed) return;
      }
      const bool fwd = action->pass == Pass::Forward;
      try {
        trace::Span span(action_name(*action, s, S, virtual_stages_), "pipeline");
        if (fwd) forward(c, action->micro_batch);
        else backward(c, action->micro_batch);
      } catch (...) {
        errors[stage] = std::current_exception();
        where[stage] = detail::str(fwd ? "forward" : "backward", " of micro-batch ", action->micro_batch,
                                   virtual_stages_ > 1 ? detail::str(" on its chunk ", action->chunk, " (model chunk ", c, ")")
                                                       : std::string(),
                                   " (its action at tick ", tick, " of the schedule)");
        std::lock_guard<std::mutex> lock(mutex);
        failed = true;
        changed.notify_all();  // the others stop waiting: nothing hangs
        return;
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
  // See Note [Checkpointed micro-batches are recomputed exactly].
  LOOM_CHECK(!recomputes || default_generator().offset() == random_offset,
             "Pipeline: the default generator drew random numbers during a step with checkpoint='", checkpoint_,
             "' (a random op in a stage?). The recomputed forward cannot draw the same ones, so the gradients are "
             "not this step's; use checkpoint='never' (train_cifar10 --pipeline-checkpoint never) for such a model");
  Tensor loss = st.losses[0];
  for (int64_t m = 1; m < M; ++m) loss = loss + st.losses[size_t(m)];
  return {loss, cat(st.logits, 0)};
}

std::string Pipeline::chunk_name(int64_t c) const {
  if (virtual_stages_ == 1) return detail::str("stage ", c);
  const auto S = static_cast<int64_t>(stage_devices_.size());
  return detail::str("model chunk ", c, " (stage ", c % S, "'s chunk ", c / S, ")");
}

std::string action_name(const Action& action, int64_t stage, int64_t stages, int64_t virtual_stages) {
  std::string out = detail::str(action.pass == Pass::Forward ? "F" : "B", action.micro_batch, " stage ", stage);
  if (virtual_stages > 1) out += detail::str(" chunk ", model_chunk(stage, action.chunk, stages));
  return out;
}

std::string Pipeline::extra_repr() const {
  return ModelParallel::extra_repr() + ", chunks=" + std::to_string(chunks_) + ", schedule=" + schedule_name_ +
         (virtual_stages_ > 1 ? ", virtual_stages=" + std::to_string(virtual_stages_) : std::string()) +
         ", checkpoint=" + checkpoint_;
}

}  // namespace loom::parallel::pipeline
