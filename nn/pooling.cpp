#include "nn/pooling.h"

#include "autograd/ops.h"

namespace loom::nn {
namespace {

void check_input(const char* layer, const Tensor& input) {
  LOOM_CHECK(input.dim() == 4, layer, ": expected 4D input [N, C, H, W], got shape ", input.shape());
}

void check_window(const char* layer, const Pair& kernel_size, const Pair& stride, const Pair& padding) {
  LOOM_CHECK(kernel_size.h > 0 && kernel_size.w > 0 && stride.h > 0 && stride.w > 0, layer,
             ": kernel_size and stride must be positive, got kernel_size=", kernel_size.str(), " stride=",
             stride.str());
  LOOM_CHECK(padding.h >= 0 && padding.w >= 0 && 2 * padding.h <= kernel_size.h && 2 * padding.w <= kernel_size.w,
             layer, ": padding should be at most half of kernel_size, got padding=", padding.str(), " kernel_size=",
             kernel_size.str());
}

}  // namespace

MaxPool2d::MaxPool2d(Pair kernel_size_, std::optional<Pair> stride_, Pair padding_, Pair dilation_, bool ceil_mode_)
    : Cloneable("MaxPool2d"),
      kernel_size(kernel_size_),
      stride(stride_.value_or(kernel_size_)),
      padding(padding_),
      dilation(dilation_),
      ceil_mode(ceil_mode_) {
  check_window("MaxPool2d", kernel_size, stride, padding);
}

Tensor MaxPool2d::forward(const Tensor& input) {
  check_input("MaxPool2d", input);
  return max_pool2d(input, kernel_size.vec(), stride.vec(), padding.vec(), dilation.vec(), ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return detail::str("kernel_size=", kernel_size.str(), ", stride=", stride.str(), ", padding=", padding.str(),
                     ", dilation=", dilation.str(), ", ceil_mode=", ceil_mode ? "True" : "False");
}

AvgPool2d::AvgPool2d(Pair kernel_size_, std::optional<Pair> stride_, Pair padding_, bool ceil_mode_,
                     bool count_include_pad_)
    : Cloneable("AvgPool2d"),
      kernel_size(kernel_size_),
      stride(stride_.value_or(kernel_size_)),
      padding(padding_),
      ceil_mode(ceil_mode_),
      count_include_pad(count_include_pad_) {
  check_window("AvgPool2d", kernel_size, stride, padding);
}

Tensor AvgPool2d::forward(const Tensor& input) {
  check_input("AvgPool2d", input);
  return avg_pool2d(input, kernel_size.vec(), stride.vec(), padding.vec(), ceil_mode, count_include_pad);
}

std::string AvgPool2d::extra_repr() const {
  return detail::str("kernel_size=", kernel_size.str(), ", stride=", stride.str(), ", padding=", padding.str());
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Pair output_size_) : Cloneable("AdaptiveAvgPool2d"), output_size(output_size_) {
  LOOM_CHECK(output_size.h > 0 && output_size.w > 0, "AdaptiveAvgPool2d: output_size must be positive, got ",
             output_size.str());
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) {
  check_input("AdaptiveAvgPool2d", input);
  return adaptive_avg_pool2d(input, output_size.vec());
}

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + output_size.str(); }

}  // namespace loom::nn
