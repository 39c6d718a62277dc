#include "nn/optim/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: abs, max, pow, sum, stack

namespace loom::nn::utils {
namespace {

std::vector<Tensor> grads_of(const std::vector<Tensor>& parameters) {
  std::vector<Tensor> grads;
  for (const Tensor& p : parameters)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

}  // namespace

Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type, bool error_if_nonfinite) {
  LOOM_CHECK(norm_type > 0, "get_total_norm: expected a positive norm_type (2.0, 1.0, inf, ...), got ", norm_type);
  NoGradGuard no_grad;
  if (tensors.empty()) return zeros({});
  const Device device = tensors[0].device();
  const bool inf = std::isinf(norm_type);
  // Each tensor's norm, on the first tensor's device (as PyTorch's norms list).
  std::vector<Tensor> norms;
  for (const Tensor& g : tensors) {
    Tensor a = abs(g.detach());
    Tensor n = inf ? max(a) : pow(sum(pow(a, norm_type)), 1.0 / norm_type);
    norms.push_back(n.to(device).to(tensors[0].dtype()));
  }
  const Tensor stacked = stack(norms);
  const Tensor total = inf ? max(stacked) : pow(sum(pow(stacked, norm_type)), 1.0 / norm_type);
  if (error_if_nonfinite) {
    const double value = total.to(kFloat64).item<double>();
    LOOM_CHECK(std::isfinite(value), "clip_grad_norm_: the total norm of order ", norm_type, " of the gradients from ",
               tensors.size(), " parameters is non-finite (", value, "), so it cannot be clipped; pass "
               "error_if_nonfinite=false to scale anyway, or find the inf/NaN (a loss scale too large, a log of zero)");
  }
  return total;
}

void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm, const Tensor& total_norm) {
  NoGradGuard no_grad;
  // PyTorch's clip_coef_clamped, as a number: every gradient is multiplied by the same factor.
  const double ratio = max_norm / (total_norm.to(kFloat64).item<double>() + 1e-6);
  const double coef = std::isnan(ratio) ? ratio : std::min(1.0, ratio);  // NaN spreads, as torch.clamp's
  for (Tensor& g : grads_of(parameters)) g.mul_(coef);
}

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  const std::vector<Tensor> grads = grads_of(parameters);
  const Tensor total = get_total_norm(grads, norm_type, error_if_nonfinite);
  if (!grads.empty()) clip_grads_with_norm_(parameters, max_norm, total);
  return total;
}

}  // namespace loom::nn::utils
