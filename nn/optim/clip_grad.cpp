#include "nn/optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: abs, max, pow, sum, stack

namespace loom::nn::utils {

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  LOOM_CHECK(norm_type > 0, "clip_grad_norm_: expected a positive norm_type (2.0, 1.0, inf, ...), got ", norm_type);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return zeros({});
  const Device device = grads[0].device();
  const bool inf = std::isinf(norm_type);
  // Each gradient's norm, on the first gradient's device (as PyTorch's norms list).
  std::vector<Tensor> norms;
  for (const Tensor& g : grads) {
    Tensor a = abs(g.detach());
    Tensor n = inf ? max(a) : pow(sum(pow(a, norm_type)), 1.0 / norm_type);
    norms.push_back(n.to(device).to(grads[0].dtype()));
  }
  const Tensor stacked = stack(norms);
  const Tensor total = inf ? max(stacked) : pow(sum(pow(stacked, norm_type)), 1.0 / norm_type);
  const double total_value = total.to(kFloat64).item<double>();
  LOOM_CHECK(!error_if_nonfinite || std::isfinite(total_value), "clip_grad_norm_: the total norm of order ",
             norm_type, " of the gradients from ", grads.size(), " parameters is non-finite (", total_value,
             "), so it cannot be clipped; pass error_if_nonfinite=false to scale anyway, or find the inf/NaN "
             "(a loss scale too large, a log of zero)");
  // PyTorch's clip_coef_clamped, as a number: every gradient is multiplied by the same factor.
  const double ratio = max_norm / (total_value + 1e-6);
  const double coef = std::isnan(ratio) ? ratio : std::min(1.0, ratio);  // NaN spreads, as torch.clamp's
  for (Tensor& g : grads) {
    Tensor target = g;
    target.mul_(coef);
  }
  return total;
}

}  // namespace loom::nn::utils
