#include "nn/linear.h"

#include "autograd/ops.h"

namespace loom::nn {

Linear::Linear(int64_t in_features_, int64_t out_features_, bool bias_)
    : Cloneable("Linear"), in_features(in_features_), out_features(out_features_), has_bias(bias_) {
  LOOM_CHECK(in_features >= 0 && out_features >= 0, "Linear: feature counts must be non-negative, got in_features=",
             in_features, " out_features=", out_features);
  reset();
}

void Linear::reset() {
  weight = register_parameter("weight", empty({out_features, in_features}));
  bias = register_parameter("bias", has_bias ? empty({out_features}) : Tensor());
  reset_parameters();
}

void Linear::reset_parameters() { init::default_layer_init_(weight, bias); }

Tensor Linear::forward(const Tensor& input) {
  check_hooks_ran();
  LOOM_CHECK(input.dim() >= 1 && input.size(-1) == in_features, "Linear(in_features=", in_features,
             ", out_features=", out_features, "): expected input whose last dimension is ", in_features, ", got ",
             input.shape());
  return linear(input, weight, adds_bias ? bias : Tensor());
}

std::string Linear::extra_repr() const {
  return detail::str("in_features=", in_features, ", out_features=", out_features, ", bias=",
                     has_bias ? "True" : "False");
}

Flatten::Flatten(int64_t start_dim_, int64_t end_dim_) : Cloneable("Flatten"), start_dim(start_dim_), end_dim(end_dim_) {}

Tensor Flatten::forward(const Tensor& input) { return flatten(input, start_dim, end_dim); }

std::string Flatten::extra_repr() const { return detail::str("start_dim=", start_dim, ", end_dim=", end_dim); }

}  // namespace loom::nn
