// Test-time augmentation: the logits of several views of each test image, weighted, as the
// CIFAR-10 speedruns evaluate (airbench's infer with tta_level 0, 1 or 2).
//
//   Tensor logits = nn::tta_logits(*model, images, nn::TTA::mirror_translate);   // model.eval() first
//   double accuracy = nn::tta_accuracy(*model, test_images, test_labels, nn::TTA::mirror_translate);
//
// Note [TTA weights]
//   TTA::none               net(x)
//   TTA::mirror             m(x) = (net(x) + net(flip(x))) / 2
//   TTA::mirror_translate   m(x) / 2 + (m(shift(x, -1, -1)) + m(shift(x, +1, +1))) / 4
// where shift(x, d, d) moves the image by one pixel along both axes with reflect padding
// (F.pad(x, 1, "reflect") cropped at (0, 0) or (2, 2)). Six forward passes in all; the
// unshifted pair weighs 1/2 because it is the view the net's statistics were gathered on.
// Each view's logits are computed in float32 and summed in this fixed order, so the result
// does not depend on the batch size.
#pragma once

#include "core/tensor.h"
#include "nn/module.h"  // defines: Module

namespace loom::nn {

enum class TTA { none = 0, mirror = 1, mirror_translate = 2 };

// The weighted logits of Note [TTA weights] for `images` [N, C, H, W], under NoGradGuard, in
// whatever mode the model is (call model.eval() first, as PyTorch's evaluation does).
Tensor tta_logits(Module& model, const Tensor& images, TTA level);

// The fraction of `images` whose argmax of tta_logits equals `labels` [N], in batches of
// `batch_size` (the images are moved to the model's device batch by batch).
double tta_accuracy(Module& model, const Tensor& images, const Tensor& labels, TTA level, int64_t batch_size = 2000);

}  // namespace loom::nn
