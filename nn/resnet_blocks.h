// The two residual blocks of torchvision's ResNets, with its module names:
//
//   BasicBlock (resnet18/34):        3x3 conv-BN-relu, 3x3 conv-BN, + shortcut, relu
//   Bottleneck (resnet50/101/152):   1x1 conv-BN-relu (reduce to `width`),
//                                    3x3 conv-BN-relu (stride here),
//                                    1x1 conv-BN (expand to planes * 4), + shortcut, relu
//
//   auto block = std::make_shared<nn::Bottleneck>(/*in_planes=*/256, /*planes=*/128, /*stride=*/2);
//   Tensor y = (*block)(x);   // [N, 256, H, W] -> [N, 512, H/2, W/2]
//
// A block's output has planes * expansion channels (1 for BasicBlock, 4 for Bottleneck). The
// shortcut is the identity when the shape is kept, else downsample = Sequential(1x1 conv with
// the block's stride, BN), so its keys are "downsample.0.weight", "downsample.1.running_mean"
// as torchvision's.
//
// Note [Bottleneck strides on the 3x3]: torchvision's Bottleneck ("ResNet V1.5") puts a
// stage's stride 2 on conv2, the 3x3, where the original paper (V1) put it on conv1, the 1x1.
// A strided 1x1 reads only one pixel in four and discards the rest; the 3x3 sees them all.
// V1.5 is what torchvision's pretrained weights expect, so loom strides the 3x3 too.
//
// Each block is one unit for FSDP's wrap policy and one layer of ResNet::sequential() (so one
// pipeline layer): ModuleWrapPolicy lists both type names (parallel/fsdp/wrap_policy.h).
#pragma once

#include <memory>

#include "nn/activation.h"  // defines: ReLU
#include "nn/batchnorm.h"   // defines: BatchNorm2d (and its fused forward_relu)
#include "nn/container.h"   // defines: Sequential
#include "nn/conv.h"        // defines: Conv2d

namespace loom::nn {

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
class BasicBlock : public Cloneable<BasicBlock> {
 public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride = 1);
  void reset() override;
  Tensor forward(const Tensor& input) override;

  int64_t in_planes, planes, stride;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Sequential> downsample;  // null when the shortcut is the identity
};

// relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x)), with conv1 and conv2
// `width` = planes * base_width / 64 channels wide (torchvision's width_per_group: 64, or 128
// for wide_resnet50_2) and conv3 expanding to planes * 4.
class Bottleneck : public Cloneable<Bottleneck> {
 public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride = 1, int64_t base_width = 64);
  void reset() override;
  Tensor forward(const Tensor& input) override;

  int64_t in_planes, planes, stride, base_width;
  int64_t width;  // conv1's and conv2's channels: planes * base_width / 64
  std::shared_ptr<Conv2d> conv1, conv2, conv3;
  std::shared_ptr<BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Sequential> downsample;  // null when the shortcut is the identity
};

}  // namespace loom::nn
