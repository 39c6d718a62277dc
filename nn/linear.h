// Layers that map or reshape features without looking at space: Linear, Flatten and
// Identity (torch.nn.Linear, torch.nn.Flatten, torch.nn.Identity).
//
//   auto fc = std::make_shared<nn::Linear>(512, 10);   // weight [10, 512], bias [10]
//   Tensor logits = fc->forward(features);              // [N, 512] -> [N, 10]
#pragma once

#include "nn/module.h"

namespace loom::nn {

// y = x @ weight^T + bias over the last dim; weight [out_features, in_features].
class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  void reset() override;
  // Re-draws weight and bias: Note [Default layer initialisation] in nn/init.h.
  void reset_parameters();
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t in_features, out_features;
  bool has_bias;
  // Whether forward adds the bias. A row-parallel layer (parallel/tensor/parallel_style.h)
  // sets it false: each rank's output is then a partial sum, and the layer's hook adds the
  // bias once, after the sum (Note [Row-parallel bias]). Copied by clone().
  bool adds_bias = true;
  Tensor weight, bias;
};

// Merges dims start_dim..end_dim into one (by default all but the batch dim).
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  void reset() override {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t start_dim, end_dim;
};

// Returns its input: a placeholder where an architecture has an optional layer.
class Identity : public Cloneable<Identity> {
 public:
  Identity() : Cloneable("Identity") {}
  void reset() override {}
  Tensor forward(const Tensor& input) override { return input; }
};

}  // namespace loom::nn
