// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019), with PyTorch's exact
// update rule, defaults and state names (torch.optim.AdamW).
//
//   auto groups = optim::param_groups_weight_decay(*model, 0.05, model->no_weight_decay());
//   optim::AdamW opt(groups, {.lr = 1e-3, .weight_decay = 0.05});
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Note [AdamW update rule]
// For each parameter p with gradient g (-g when maximize), PyTorch 1.13's
// _single_tensor_adamw, step by step:
//   step += 1
//   p = p * (1 - lr * weight_decay)                       decoupled: not through the moments
//   exp_avg    = beta1 * exp_avg    + (1 - beta1) * g
//   exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
//   max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)       amsgrad only; then used below
//   denom = sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps
//   p = p - (lr / (1 - beta1^step)) * exp_avg / denom
// The scalars (bias corrections, step size) are computed in double, as Python does; the
// per-element arithmetic in the parameter's dtype, one fused loop per parameter (one read
// of p, g and both moments, one write of each). State per parameter, PyTorch's names:
// "step" (a 0-d float32 tensor, as PyTorch 1.13's), "exp_avg", "exp_avg_sq" and, with
// amsgrad, "max_exp_avg_sq". PyTorch's betas tuple is the two hyperparameters "beta1" and
// "beta2" of a group (a group's options are flat numbers: Note [Flat optimizer state]).
//
// The fused loop is a kernel per device (adamw_update_kernel): core's CPU loop, and
// cuda/adamw.cu's on CUDA parameters (compiled, not yet run on a GPU).
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "nn/module.h"              // defines: Module
#include "nn/optim/optimizer.h"     // defines: Optimizer, ParamGroup

namespace loom::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(const std::vector<Tensor>& params, AdamWOptions options = {});
  // Groups with their own options ("lr", "beta1", "beta2", "eps", "weight_decay",
  // "amsgrad", "maximize"); missing ones come from `defaults`.
  AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {});

  void step() override;
};

// timm's param_groups_weight_decay: two groups, [no decay, decay]. A parameter gets no
// weight decay when it has one dim or none (biases, LayerNorm and BatchNorm weights), its
// name ends in ".bias", it belongs to an nn::Embedding, or its name is in
// `no_weight_decay` (a ViT's "cls_token" and "pos_embed": VisionTransformer::no_weight_decay).
// Decaying them pulls normalisation gains and positions toward zero for no benefit.
std::vector<ParamGroup> param_groups_weight_decay(const nn::Module& model, double weight_decay,
                                                  const std::set<std::string>& no_weight_decay = {});

// The rule above for one parameter of `model`, by its name and number of dimensions: true
// when it gets no weight decay. For a caller that steps pieces of the parameters (FSDP's
// shards, a pipeline stage's) and decides from the whole parameter's name and shape.
std::function<bool(const std::string& name, int64_t dim)> exempt_from_weight_decay(
    const nn::Module& model, const std::set<std::string>& no_weight_decay = {});

}  // namespace loom::optim
