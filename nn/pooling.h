// Pooling layers over NCHW input: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, with
// torch.nn's arguments and defaults (stride defaults to kernel_size).
//
//   auto pool = std::make_shared<nn::MaxPool2d>(/*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
//   auto gap = std::make_shared<nn::AdaptiveAvgPool2d>(1);   // [N, C, H, W] -> [N, C, 1, 1]
#pragma once

#include <optional>

#include "nn/module.h"
#include "nn/pair.h"

namespace loom::nn {

class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(Pair kernel_size, std::optional<Pair> stride = std::nullopt, Pair padding = 0,
                     Pair dilation = 1, bool ceil_mode = false);
  void reset() override {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Pair kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(Pair kernel_size, std::optional<Pair> stride = std::nullopt, Pair padding = 0,
                     bool ceil_mode = false, bool count_include_pad = true);
  void reset() override {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Pair kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
};

// Averages over windows chosen so the output is exactly output_size, whatever the input.
class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(Pair output_size);
  void reset() override {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Pair output_size;
};

}  // namespace loom::nn
