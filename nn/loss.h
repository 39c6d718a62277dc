// CrossEntropyLoss: log_softmax + negative log likelihood over class logits, as
// torch.nn.CrossEntropyLoss.
//
//   nn::CrossEntropyLoss criterion;                       // mean over the batch
//   Tensor loss = criterion(logits, labels);              // logits [N, C], labels int64 [N]
//   loss.backward();
//
// weight (per-class, [C]) is a buffer as in PyTorch, so it moves with to() and appears
// in state_dict when given. Targets equal to ignore_index contribute nothing (and do not
// count in the mean's denominator); label_smoothing mixes the one-hot target with the
// uniform distribution: (1 - eps) * one_hot + eps / C.
#pragma once

#include "core/kernels.h"
#include "nn/module.h"

namespace loom::nn {

class CrossEntropyLoss : public Cloneable<CrossEntropyLoss> {
 public:
  explicit CrossEntropyLoss(const Tensor& weight = Tensor(), Reduction reduction = Reduction::Mean,
                            int64_t ignore_index = -100, double label_smoothing = 0.0);
  void reset() override;
  Tensor forward(const Tensor& input, const Tensor& target);
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  using Module::forward;  // the one-argument form is an error for a loss
  std::string extra_repr() const override;

  Tensor weight;
  Reduction reduction;
  int64_t ignore_index;
  double label_smoothing;
};

}  // namespace loom::nn
