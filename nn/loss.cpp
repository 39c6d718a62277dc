#include "nn/loss.h"

#include "autograd/ops.h"
#include "core/copy.h"

namespace loom::nn {

CrossEntropyLoss::CrossEntropyLoss(const Tensor& weight_, Reduction reduction_, int64_t ignore_index_,
                                   double label_smoothing_)
    : Cloneable("CrossEntropyLoss"),
      weight(weight_),
      reduction(reduction_),
      ignore_index(ignore_index_),
      label_smoothing(label_smoothing_) {
  LOOM_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "CrossEntropyLoss: label_smoothing must be in [0, 1], got ",
             label_smoothing);
  LOOM_CHECK(!weight.defined() || weight.dim() == 1, "CrossEntropyLoss: weight must be a 1-D tensor of per-class "
             "weights, got shape ", weight.shape());
  reset();
  if (weight_.defined()) copy_into(weight, weight_);  // a copy, as torch's register_buffer keeps its own
}

// The class weights are the only state. reset() registers a fresh tensor (never the
// caller's): see Note [Cloneable].
void CrossEntropyLoss::reset() {
  weight = register_buffer("weight", weight.defined() ? empty_like(weight) : Tensor());
}

Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  return cross_entropy(input, target, weight, reduction, ignore_index, label_smoothing);
}

std::string CrossEntropyLoss::extra_repr() const {
  const char* names[] = {"none", "mean", "sum"};
  return detail::str("reduction=", names[static_cast<int>(reduction)], ", ignore_index=", ignore_index,
                     ", label_smoothing=", label_smoothing);
}

}  // namespace loom::nn
