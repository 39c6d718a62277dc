#include "train/grad_clipping.h"

#include "core/error.h"                 // defines: LOOM_CHECK
#include "nn/optim/clip_grad.h"         // defines: clip_grads_with_norm_
#include "parallel/sharded_norm.h"      // defines: total_norm_over

namespace loom::training {
GradClipper::GradClipper(const ParallelModel& parallel, optim::Optimizer& optimizer, double max_norm)
    : optimizer_(optimizer), max_norm_(max_norm) {
  LOOM_CHECK(max_norm > 0, "GradClipper: max_norm must be positive (0 means no clipping: make no clipper), got ",
             max_norm);
  for (const auto& group : optimizer.param_groups())
    for (const Tensor& p : group.params) params_.push_back(p);
  terms_ = parallel.grad_norm_terms(params_);  // Note [Whose gradients a rank adds to the norm]
}

double GradClipper::clip(MixedPrecision& amp) {
  amp.scaler().unscale_(optimizer_);  // the true gradients (a no-op without --amp fp16)
  std::vector<Tensor> grads;
  for (const Tensor& p : terms_.counted)
    if (p.grad().defined()) grads.push_back(p.grad());
  const Tensor total = distributed::total_norm_over(grads, terms_.sum_over);
  nn::utils::clip_grads_with_norm_(params_, max_norm_, total);
  return total.item<double>();
}

}  // namespace loom::training
