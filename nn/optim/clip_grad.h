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
#pragma once

#include <vector>

#include "core/tensor.h"  // defines: Tensor

namespace loom::nn::utils {

// error_if_nonfinite: a loom::Error when the total norm is inf or NaN (nothing is scaled).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace loom::nn::utils
