#include "nn/activation.h"

#include "autograd/ops.h"

namespace loom::nn {

Tensor ReLU::forward(const Tensor& input) { return relu(input); }

GELU::GELU(std::string approximate_) : Cloneable("GELU"), approximate(std::move(approximate_)) {
  LOOM_CHECK(approximate == "none" || approximate == "tanh", "GELU: expected approximate \"none\" or \"tanh\", got \"",
             approximate, "\"");
}

Tensor GELU::forward(const Tensor& input) { return gelu(input, approximate); }

std::string GELU::extra_repr() const { return approximate == "none" ? "" : detail::str("approximate='", approximate, "'"); }

Dropout::Dropout(double p_, Generator* gen) : Cloneable("Dropout"), p(p_), generator(gen) {
  LOOM_CHECK(p >= 0 && p <= 1, "Dropout: probability has to be between 0 and 1, but got ", p);
}

Tensor Dropout::forward(const Tensor& input) { return dropout(input, p, is_training(), generator); }

std::string Dropout::extra_repr() const { return detail::str("p=", p); }

}  // namespace loom::nn
