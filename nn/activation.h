// Elementwise layers without parameters: ReLU, GELU and Dropout (torch.nn.ReLU,
// torch.nn.GELU, torch.nn.Dropout).
//
//   auto drop = std::make_shared<nn::Dropout>(0.5);
//   Tensor y = drop->forward(x);   // training: zeroes each element with probability p and
//                                  // scales the rest by 1/(1-p); eval: returns x
#pragma once

#include <string>

#include "core/generator.h"
#include "nn/module.h"

namespace loom::nn {

class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() : Cloneable("ReLU") {}
  void reset() override {}
  Tensor forward(const Tensor& input) override;
};

// x * Phi(x), or its tanh approximation with approximate = "tanh" (see loom::gelu).
class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(std::string approximate = "none");
  void reset() override {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  std::string approximate;
};

class Dropout : public Cloneable<Dropout> {
 public:
  // gen: where masks come from; null means the default generator (loom::manual_seed).
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  void reset() override {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  double p;
  Generator* generator;
};

}  // namespace loom::nn
