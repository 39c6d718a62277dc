#include "nn/checkpoint.h"

#include <memory>    // defines: std::make_unique
#include <optional>  // defines: std::optional (an autocast scope opened only where the forward had one)

#include "autograd/autocast.h"    // defines: autocast::Guard, is_enabled, get_dtype (the forward's state, restored)
#include "autograd/engine.h"      // defines: backward_within (Note [A backward inside a backward])
#include "autograd/grad_mode.h"   // defines: NoGradGuard, EnableGradGuard
#include "autograd/saved_tensor.h"  // defines: SavedTensor (the kept input, checked unmodified)
#include "autograd/variable.h"    // defines: record (the one node standing for the segment)
#include "core/error.h"           // defines: LOOM_CHECK
#include "core/generator.h"       // defines: default_generator, ReplayRandomScope

namespace loom::nn {

namespace {

// What the recomputation must see again: Note [A recomputation is the same forward].
struct ForwardState {
  uint64_t seed = 0, first_offset = 0, last_offset = 0;  // the default generator around the forward
  bool autocast_enabled[kNumDeviceTypes] = {};
  DType autocast_dtype[kNumDeviceTypes] = {};

  static ForwardState before_forward() {
    ForwardState state;
    state.seed = default_generator().seed();
    state.first_offset = default_generator().offset();
    for (int t = 0; t < kNumDeviceTypes; ++t) {
      const auto type = static_cast<DeviceType>(t);
      state.autocast_enabled[t] = autocast::is_enabled(type);
      state.autocast_dtype[t] = autocast::get_dtype(type);
    }
    return state;
  }
  bool drew_random_numbers() const { return last_offset != first_offset; }
};

// Runs fn(x) again as the first forward ran it, with the graph.
Tensor recompute(const std::function<Tensor(const Tensor&)>& fn, const Tensor& x, const ForwardState& state,
                 const Module* buffers_of) {
  EnableGradGuard grad;
  std::optional<autocast::Guard> autocast_scopes[kNumDeviceTypes];
  for (int t = 0; t < kNumDeviceTypes; ++t)
    if (state.autocast_enabled[t]) autocast_scopes[t].emplace(static_cast<DeviceType>(t), state.autocast_dtype[t]);
  std::unique_ptr<RestoreBuffers> undo;  // the recomputation's update of the running statistics
  if (buffers_of) undo = std::make_unique<RestoreBuffers>(*buffers_of);
  ReplayRandomScope replay(state.seed, state.first_offset);  // Note [A recomputation draws its random numbers again]
  Tensor y = fn(x);
  LOOM_CHECK(replay.offset() == state.last_offset, "checkpoint: the recomputed forward drew ",
             replay.offset() - state.first_offset, " random numbers where the first drew ",
             state.last_offset - state.first_offset, " (is the segment in another training mode than when it "
             "ran?); its gradients would not be those of the forward that ran");
  return y;
}

}  // namespace

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input, const Module* buffers_of) {
  LOOM_CHECK(fn, "checkpoint: the function is empty");
  LOOM_CHECK(input.defined(), "checkpoint: the input is an undefined tensor");
  if (!GradMode::is_enabled()) return fn(input);  // nothing would be kept anyway
  ForwardState state = ForwardState::before_forward();
  Tensor out;
  {
    NoGradGuard no_graph;  // Note [Activation checkpointing]: nothing kept but the input
    ReplayRandomScope draws(state.seed, state.first_offset);  // the segment's draws, counted apart
    out = fn(input);
    state.last_offset = draws.offset();
  }
  // Note [A recomputation draws its random numbers again]: the default generator moves
  // past what the segment drew, as if it had drawn from it directly.
  if (state.drew_random_numbers()) {
    const uint64_t first = default_generator().reserve(state.last_offset - state.first_offset);
    LOOM_CHECK(first == state.first_offset, "checkpoint: another thread drew from the default generator while the "
               "segment's forward drew its random numbers (DP replica threads share it), so the segment's dropout "
               "masks overlap another's. Checkpoint no segment that draws random numbers under --mode dp, or set "
               "its Dropout's p to 0");
  }
  LOOM_CHECK(out.defined(), "checkpoint: the function returned an undefined tensor");
  if (out.is_same(input)) out = out.detach();  // the node's output must be a tensor of its own
  const bool input_requires_grad = input.requires_grad();
  SavedTensor kept(input, "checkpoint");
  record("CheckpointFunctionBackward", {input}, {out},
         [fn, kept, state, buffers_of, input_requires_grad](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
           Tensor x = kept.get().detach();
           if (input_requires_grad) x.requires_grad_(true);  // a leaf: its grad() is the input's gradient
           Tensor y = recompute(fn, x, state, buffers_of);
           LOOM_CHECK(y.shape() == grads[0].shape(), "checkpoint: the recomputed forward returned ", y.shape(),
                      " where the first returned ", grads[0].shape());
           if (y.requires_grad()) autograd::backward_within({y}, {grads[0]});
           return {input_requires_grad ? x.grad() : Tensor()};
         });
  return out;
}

std::vector<std::string> apply_activation_checkpointing(
    Module& model, const std::function<bool(const std::string& name, Module& module)>& check_fn) {
  LOOM_CHECK(check_fn, "apply_activation_checkpointing: check_fn is empty");
  std::vector<std::string> marked;
  for (const auto& [name, module] : model.named_modules()) {
    if (!check_fn(name, *module)) continue;
    module->set_activation_checkpointing(true);
    marked.push_back(name);
  }
  return marked;
}

RestoreBuffers::RestoreBuffers(const Module& module) : buffers_(module.named_buffers().values()) {
  NoGradGuard no_grad;
  for (const Tensor& b : buffers_) copies_.push_back(b.clone());
}

RestoreBuffers::~RestoreBuffers() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(copies_[i]);
}

}  // namespace loom::nn
