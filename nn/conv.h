// Conv2d: 2-D convolution over NCHW input, as torch.nn.Conv2d (zero padding).
//
//   auto conv = std::make_shared<nn::Conv2d>(3, 64, /*kernel_size=*/3, /*stride=*/1, /*padding=*/1,
//                                            /*dilation=*/1, /*groups=*/1, /*bias=*/false);
//   Tensor y = conv->forward(x);   // [N, 3, H, W] -> [N, 64, H, W]
//
// weight: [out_channels, in_channels / groups, kh, kw]; bias: [out_channels] or
// undefined when bias=false (then it is not a parameter and not in state_dict, as PyTorch).
#pragma once

#include "nn/module.h"
#include "nn/pair.h"

namespace loom::nn {

class Conv2d : public Cloneable<Conv2d> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Pair stride = 1, Pair padding = 0,
         Pair dilation = 1, int64_t groups = 1, bool bias = true);

  // Creates weight and bias; reset_parameters() re-draws them with PyTorch's default
  // initialisation (Note [Default layer initialisation] in nn/init.h).
  void reset() override;
  void reset_parameters();
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t in_channels, out_channels;
  Pair kernel_size, stride, padding, dilation;
  int64_t groups;
  bool has_bias;
  // Whether forward adds the bias. A row-parallel layer (parallel/tensor/parallel_style.h)
  // sets it false: each rank's output is then a partial sum, and the layer's hook adds the
  // bias once, after the sum (Note [Row-parallel bias]). Copied by clone().
  bool adds_bias = true;
  Tensor weight, bias;
};

}  // namespace loom::nn

