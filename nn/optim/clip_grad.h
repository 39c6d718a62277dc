// clip_grad_norm_: rescales gradients so that their joint norm is at most max_norm, as
// torch.nn.utils.clip_grad_norm_. A transformer's first steps under AdamW make large
// updates; clipping at 1.0 is the usual guard.
//
//   loss.backward();
//   Tensor norm = nn::utils::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
//   opt.step();
//
// total = ||(||g_1||_p, ..., ||g_n||_p)||_p over the parameters that have a gradient (the
// p-norm of all gradients as one vector; p = inf: the largest |g|), returned as a 0-d
// tensor on the first gradient's device, before clipping. Then every gradient is multiplied
// in place by min(1, max_norm / (total + 1e-6)), PyTorch's clip_coef_clamped, so gradients
// already within the bound are left as they are (multiplied by exactly 1).
//
// Note [Clipping sharded gradients]
// clip_grad_norm_ is get_total_norm then clip_grads_with_norm_ (PyTorch 2.6's two halves).
// Where each rank holds a shard of the gradients (FSDP's flat shards, a tensor-parallel
// weight's rows), the norm to clip by is the whole model's: each rank takes
// get_total_norm of its shards, raises it to the p-th power, the ranks sum that (the max,
// for p = inf), the p-th root is the total, and every rank calls clip_grads_with_norm_
// with it, as PyTorch's FSDP.clip_grad_norm_ does.
#pragma once

#include <vector>

#include "core/tensor.h"  // defines: Tensor

namespace loom::nn::utils {

// error_if_nonfinite: a loom::Error when the total norm is inf or NaN (nothing is scaled).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// The p-norm of `tensors` as one vector (0 for none), a 0-d tensor on the first one's device.
Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type = 2.0, bool error_if_nonfinite = false);

// Multiplies every gradient of `parameters` by min(1, max_norm / (total_norm + 1e-6)).
void clip_grads_with_norm_(const std::vector<Tensor>& parameters, double max_norm, const Tensor& total_norm);

}  // namespace loom::nn::utils
