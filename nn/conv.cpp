#include "nn/conv.h"

#include "autograd/ops.h"

namespace loom::nn {

Conv2d::Conv2d(int64_t in_channels_, int64_t out_channels_, Pair kernel_size_, Pair stride_, Pair padding_,
               Pair dilation_, int64_t groups_, bool bias_)
    : Cloneable("Conv2d"),
      in_channels(in_channels_),
      out_channels(out_channels_),
      kernel_size(kernel_size_),
      stride(stride_),
      padding(padding_),
      dilation(dilation_),
      groups(groups_),
      has_bias(bias_) {
  LOOM_CHECK(in_channels > 0 && out_channels > 0, "Conv2d: channel counts must be positive, got in_channels=",
             in_channels, " out_channels=", out_channels);
  LOOM_CHECK(groups > 0 && in_channels % groups == 0 && out_channels % groups == 0, "Conv2d: in_channels (",
             in_channels, ") and out_channels (", out_channels, ") must both be divisible by groups (", groups, ")");
  LOOM_CHECK(kernel_size.h > 0 && kernel_size.w > 0 && stride.h > 0 && stride.w > 0 && dilation.h > 0 &&
                 dilation.w > 0 && padding.h >= 0 && padding.w >= 0,
             "Conv2d: kernel_size, stride and dilation must be positive and padding non-negative, got kernel_size=",
             kernel_size.str(), " stride=", stride.str(), " padding=", padding.str(), " dilation=", dilation.str());
  reset();
}

void Conv2d::reset() {
  weight = register_parameter("weight", empty({out_channels, in_channels / groups, kernel_size.h, kernel_size.w}));
  bias = register_parameter("bias", has_bias ? empty({out_channels}) : Tensor());
  reset_parameters();
}

void Conv2d::reset_parameters() { init::default_layer_init_(weight, bias); }

Tensor Conv2d::forward(const Tensor& input) {
  check_hooks_ran();
  LOOM_CHECK(input.dim() == 4 && input.size(1) == in_channels, "Conv2d(", in_channels, ", ", out_channels,
             "): expected input of shape [N, ", in_channels, ", H, W], got ", input.shape());
  return conv2d(input, weight, adds_bias ? bias : Tensor(), stride.vec(), padding.vec(), dilation.vec(), groups);
}

std::string Conv2d::extra_repr() const {
  std::string s = detail::str(in_channels, ", ", out_channels, ", kernel_size=", kernel_size.str(),
                              ", stride=", stride.str());
  if (padding != Pair(0)) s += ", padding=" + padding.str();
  if (dilation != Pair(1)) s += ", dilation=" + dilation.str();
  if (groups != 1) s += detail::str(", groups=", groups);
  if (!has_bias) s += ", bias=False";
  return s;
}

}  // namespace loom::nn
