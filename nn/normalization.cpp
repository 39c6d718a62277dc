#include "nn/normalization.h"

#include "autograd/ops.h"  // defines: layer_norm

namespace loom::nn {

LayerNorm::LayerNorm(Shape normalized_shape_, double eps_, bool elementwise_affine_, bool bias_)
    : Cloneable("LayerNorm"),
      normalized_shape(std::move(normalized_shape_)),
      eps(eps_),
      elementwise_affine(elementwise_affine_),
      has_bias(bias_) {
  LOOM_CHECK(!normalized_shape.empty(), "LayerNorm: expected a non-empty normalized_shape (the trailing dims to "
             "normalise, e.g. {embed_dim}), got []");
  for (int64_t d : normalized_shape)
    LOOM_CHECK(d > 0, "LayerNorm: expected positive sizes in normalized_shape, got ", normalized_shape);
  reset();
}

void LayerNorm::reset() {
  weight = register_parameter("weight", elementwise_affine ? empty(normalized_shape) : Tensor());
  bias = register_parameter("bias", elementwise_affine && has_bias ? empty(normalized_shape) : Tensor());
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& input) { return layer_norm(input, normalized_shape, weight, bias, eps); }

std::string LayerNorm::extra_repr() const {
  std::string dims;  // Python's tuple: "(192,)", "(2, 3)"
  for (size_t i = 0; i < normalized_shape.size(); ++i) dims += detail::str(i ? ", " : "", normalized_shape[i]);
  if (normalized_shape.size() == 1) dims += ",";
  return detail::str("(", dims, "), eps=", eps, ", elementwise_affine=", elementwise_affine ? "True" : "False");
}

}  // namespace loom::nn
