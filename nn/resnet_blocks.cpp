#include "nn/resnet_blocks.h"

#include <string>

namespace loom::nn {

namespace {

// torchvision's conv3x3 / conv1x1: no bias, since a BatchNorm follows each conv.
std::shared_ptr<Conv2d> conv3x3(int64_t in_planes, int64_t out_planes, int64_t stride) {
  return std::make_shared<Conv2d>(in_planes, out_planes, 3, stride, /*padding=*/1, /*dilation=*/1, /*groups=*/1,
                                  /*bias=*/false);
}
std::shared_ptr<Conv2d> conv1x1(int64_t in_planes, int64_t out_planes, int64_t stride = 1) {
  return std::make_shared<Conv2d>(in_planes, out_planes, 1, stride, /*padding=*/0, /*dilation=*/1, /*groups=*/1,
                                  /*bias=*/false);
}

// The projection shortcut torchvision's _make_layer builds when a block changes the shape.
std::shared_ptr<Sequential> downsample_or_null(int64_t in_planes, int64_t out_planes, int64_t stride) {
  if (stride == 1 && in_planes == out_planes) return nullptr;
  return std::make_shared<Sequential>(
      std::vector<std::shared_ptr<Module>>{conv1x1(in_planes, out_planes, stride), std::make_shared<BatchNorm2d>(out_planes)});
}

void check_block_args(const char* block, int64_t in_planes, int64_t planes, int64_t stride) {
  LOOM_CHECK(in_planes > 0 && planes > 0 && stride > 0, block, ": expected positive in_planes, planes and stride, got ",
             in_planes, ", ", planes, " and ", stride);
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_planes_, int64_t planes_, int64_t stride_)
    : Cloneable("BasicBlock"), in_planes(in_planes_), planes(planes_), stride(stride_) {
  check_block_args("BasicBlock", in_planes, planes, stride);
  reset();
}

void BasicBlock::reset() {
  conv1 = register_module("conv1", conv3x3(in_planes, planes, stride));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  relu = register_module("relu", std::make_shared<ReLU>());
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  downsample = downsample_or_null(in_planes, planes * expansion, stride);
  if (downsample) register_module("downsample", downsample);
}

// relu(bn(.)) and relu(bn(.) + shortcut) run as single fused ops (BatchNorm2d::
// forward_relu, Note [Fused BatchNorm epilogue]): the same values, two fewer passes over
// each activation. The relu module stays for the module tree and the state_dict layout.
Tensor BasicBlock::forward(const Tensor& input) {
  Tensor out = (*conv2)(bn1->forward_relu((*conv1)(input)));
  Tensor shortcut = downsample ? (*downsample)(input) : input;
  return bn2->forward_relu(out, shortcut);
}

Bottleneck::Bottleneck(int64_t in_planes_, int64_t planes_, int64_t stride_, int64_t base_width_)
    : Cloneable("Bottleneck"),
      in_planes(in_planes_),
      planes(planes_),
      stride(stride_),
      base_width(base_width_),
      width(planes_ * base_width_ / 64) {
  check_block_args("Bottleneck", in_planes, planes, stride);
  LOOM_CHECK(width > 0, "Bottleneck: planes * base_width / 64 must be at least 1 channel, got planes ", planes,
             " and base_width ", base_width);
  reset();
}

void Bottleneck::reset() {
  conv1 = register_module("conv1", conv1x1(in_planes, width));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(width));
  conv2 = register_module("conv2", conv3x3(width, width, stride));  // Note [Bottleneck strides on the 3x3]
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(width));
  conv3 = register_module("conv3", conv1x1(width, planes * expansion));
  bn3 = register_module("bn3", std::make_shared<BatchNorm2d>(planes * expansion));
  relu = register_module("relu", std::make_shared<ReLU>());
  downsample = downsample_or_null(in_planes, planes * expansion, stride);
  if (downsample) register_module("downsample", downsample);
}

// Fused as BasicBlock::forward: each relu rides on the BatchNorm before it.
Tensor Bottleneck::forward(const Tensor& input) {
  Tensor out = bn1->forward_relu((*conv1)(input));
  out = bn2->forward_relu((*conv2)(out));
  out = (*conv3)(out);
  Tensor shortcut = downsample ? (*downsample)(input) : input;
  return bn3->forward_relu(out, shortcut);
}

}  // namespace loom::nn
