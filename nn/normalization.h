// LayerNorm: normalisation over each sample's trailing dims, as torch.nn.LayerNorm.
//
//   auto norm = std::make_shared<nn::LayerNorm>(Shape{192}, /*eps=*/1e-6);
//   Tensor y = (*norm)(x);   // x [N, L, 192]: each token's 192 features to mean 0, variance 1,
//                            // then * weight + bias
//
// Unlike BatchNorm it keeps no running statistics and behaves the same in training and
// eval: each row is normalised with its own mean and biased variance. Parameters (when
// elementwise_affine) weight (1s) and bias (0s, unless bias = false, PyTorch 2.1's
// argument) have the shape normalized_shape.
#pragma once

#include "nn/module.h"  // defines: Module, Cloneable

namespace loom::nn {

class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  void reset() override;
  void reset_parameters();  // weight 1, bias 0
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Shape normalized_shape;
  double eps;
  bool elementwise_affine, has_bias;
  Tensor weight, bias;  // undefined unless elementwise_affine (bias: and has_bias)
};

}  // namespace loom::nn
