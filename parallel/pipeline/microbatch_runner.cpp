#include "parallel/pipeline/microbatch_runner.h"

#include <algorithm>  // defines: std::min

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: chunk, cat
#include "core/error.h"          // defines: LOOM_CHECK
#include "core/generator.h"      // defines: default_generator (what a recomputation cannot draw again)
#include "nn/activation.h"       // defines: nn::Dropout
#include "nn/checkpoint.h"       // defines: nn::RestoreBuffers
#include "core/trace.h"          // defines: trace::Span (a recomputation inside its backward's span)

namespace loom::parallel::pipeline {

namespace {

// The first Dropout of `module` that would draw a mask (p > 0, training), named and
// printed ("'1': Dropout(p=0.5)"), or "".
std::string random_layer(nn::Module& module) {
  for (const auto& [name, layer] : module.named_modules()) {
    const auto* dropout = dynamic_cast<const nn::Dropout*>(layer.get());
    if (dropout && dropout->p > 0 && dropout->is_training()) return detail::str("'", name, "': ", dropout->str());
  }
  return "";
}

}  // namespace

std::vector<int64_t> micro_batch_sizes(int64_t batch, int64_t n_microbatches) {
  const int64_t each = (batch - 1) / n_microbatches + 1;
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < batch; start += each) sizes.push_back(std::min(each, batch - start));
  return sizes;
}

std::string virtual_stage_name(int64_t virtual_stage, int64_t stages, int64_t virtual_stages) {
  if (virtual_stages == 1) return detail::str("stage ", virtual_stage);
  return detail::str("virtual stage ", virtual_stage, " (on stage ", virtual_stage % stages, ")");
}

std::string action_name(const Action& action, int64_t stage, int64_t stages, int64_t virtual_stages) {
  std::string out = detail::str(action.pass == Pass::Forward ? "F" : "B", action.micro_batch, " stage ", stage);
  if (virtual_stages > 1) out += detail::str(" virtual stage ", virtual_stage(stage, action.local_stage, stages));
  return out;
}

MicrobatchRunner::MicrobatchRunner(std::vector<VirtualStage> virtual_stages, int64_t stages, const LossFn& loss_fn,
                                   int64_t batch, int64_t n_microbatches, const Tensor& input, const Tensor& target,
                                   double loss_scale, std::string checkpoint)
    : virtual_stages_(std::move(virtual_stages)),
      stages_(stages),
      loss_fn_(loss_fn),
      batch_(batch),
      loss_scale_(loss_scale),
      checkpoint_(std::move(checkpoint)),
      sizes_(micro_batch_sizes(batch, n_microbatches)) {
  if (input.defined()) micro_inputs_ = chunk(input.detach(), n_microbatches, 0);
  if (target.defined()) micro_targets_ = chunk(target, n_microbatches, 0);
  const size_t C = virtual_stages_.size(), M = sizes_.size();
  inputs_.assign(C, std::vector<Tensor>(M));
  outputs_.assign(C, std::vector<Tensor>(M));
  losses_.resize(M);
  logits_.resize(M);
  // See Note [Checkpointed micro-batches are recomputed exactly]: what cannot be
  // recomputed is refused before the step, and a draw during it is caught after it.
  for (size_t c = 0; recomputes() && c < C; ++c) {
    if (!virtual_stages_[c].module) continue;
    const std::string layer = random_layer(*virtual_stages_[c].module);
    LOOM_CHECK(layer.empty(), name(int64_t(c)), " has a Dropout in training mode (", layer, "), which draws a new "
               "mask when checkpoint='", checkpoint_, "' recomputes its forward, so the gradients would not be this "
               "step's. Use checkpoint='never', or put the module in eval mode");
  }
  random_offset_ = default_generator().offset();
}

void MicrobatchRunner::check_recomputed_exactly() const {
  LOOM_CHECK(!recomputes() || default_generator().offset() == random_offset_, "the default generator drew random "
             "numbers during a step with checkpoint='", checkpoint_, "' (a random op in a stage?). The "
             "recomputed forward cannot draw the same ones, so the gradients are not this step's; use "
             "checkpoint='never' for such a model");
}

bool MicrobatchRunner::checkpointed(int64_t m) const {
  return checkpoint_ == "always" || (checkpoint_ == "except_last" && m < n_microbatches() - 1);
}

std::string MicrobatchRunner::name(int64_t c) const {
  return virtual_stage_name(c, stages_, static_cast<int64_t>(virtual_stages_.size()) / stages_);
}

Tensor MicrobatchRunner::run(int64_t c, int64_t m, const Tensor& x) {
  Tensor y = (*virtual_stages_[size_t(c)].module)(x);
  if (c + 1 < static_cast<int64_t>(virtual_stages_.size())) {
    LOOM_CHECK(y.dim() >= 1 && y.size(0) == sizes_[size_t(m)], "the output ", y.str(), " of ", name(c),
               " does not keep the micro-batch's ", sizes_[size_t(m)], " samples in its first dimension");
    return y;
  }
  const Tensor& t = micro_targets_[size_t(m)];
  // Note [Micro-batch losses add up to the batch's]
  Tensor loss = loss_fn_(y, t.to(y.device())) * (static_cast<double>(t.size(0)) / static_cast<double>(batch_));
  losses_[size_t(m)] = loss.detach();
  logits_[size_t(m)] = y.detach();
  return loss_scale_ == 1.0 ? loss : loss * loss_scale_;  // GradScaler's scale under fp16
}

// See Note [One graph per virtual stage and micro-batch].
Tensor MicrobatchRunner::forward(int64_t c, int64_t m, const Tensor& from_previous) {
  const Device& device = virtual_stages_[size_t(c)].device;
  Tensor x = c == 0 ? micro_inputs_[size_t(m)].to(device) : from_previous.to(device);
  if (c > 0) x = x.detach().requires_grad_(true);  // a leaf: its .grad() is what c - 1's backward needs
  if (c > 0 || checkpointed(m)) inputs_[size_t(c)][size_t(m)] = x;
  const bool last = c + 1 == static_cast<int64_t>(virtual_stages_.size());
  if (!checkpointed(m)) {
    outputs_[size_t(c)][size_t(m)] = run(c, m, x);
    return last ? Tensor() : outputs_[size_t(c)][size_t(m)].detach();
  }
  // See Note [Checkpointed micro-batches are recomputed exactly]: no graph, nothing kept
  // but the input; the backward runs it again.
  NoGradGuard no_graph;
  Tensor y = run(c, m, x);
  return last ? Tensor() : y;
}

Tensor MicrobatchRunner::backward(int64_t c, int64_t m, const Tensor& from_next) {
  Tensor& in = inputs_[size_t(c)][size_t(m)];
  Tensor& out = outputs_[size_t(c)][size_t(m)];
  if (checkpointed(m)) {
    trace::Span span("recompute", "pipeline");  // inside its backward's span: the price of checkpointing, drawn
    nn::RestoreBuffers undo(*virtual_stages_[size_t(c)].module);  // the recomputation's update of the running statistics
    out = run(c, m, in);
  }
  if (c + 1 == static_cast<int64_t>(virtual_stages_.size())) {
    out.backward();
  } else {
    LOOM_CHECK(from_next.defined(), "no gradient came for the output of ", name(c), " for micro-batch ", m);
    if (out.requires_grad()) out.backward(from_next.to(out.device()));
  }
  out = Tensor();  // frees this micro-batch's graph on this virtual stage
  if (c == 0) {
    in = Tensor();  // the kept input of a checkpointed micro-batch
    return Tensor();
  }
  Tensor grad = in.grad();
  LOOM_CHECK(grad.defined(), name(c), " left no gradient for its input of micro-batch ", m,
             "; does its first layer use its input?");
  in = Tensor();
  return grad;
}

Tensor MicrobatchRunner::loss() const {
  Tensor loss = losses_[0];
  for (size_t m = 1; m < losses_.size(); ++m) loss = loss + losses_[m];
  return loss;
}

Tensor MicrobatchRunner::output() const { return cat(logits_, 0); }

}  // namespace loom::parallel::pipeline
