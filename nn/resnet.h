// ResNet for CIFAR-10 (32x32 images), with torchvision's module names.
//
//   auto model = nn::resnet18(/*num_classes=*/10);   // 11,173,962 parameters
//   Tensor logits = model->forward(images);          // [N, 3, 32, 32] -> [N, 10]
//
// The CIFAR variant differs from torchvision's ImageNet resnet18 only in the stem: a
// 3x3 conv with stride 1 and no max-pool instead of a 7x7 stride-2 conv and a 3x3
// max-pool, so that 32x32 inputs are not shrunk to 8x8 before the first block. Stages
// then run at 32, 16, 8 and 4 pixels. Module names (conv1, bn1, layer1.0.conv1,
// layer2.0.downsample.0, fc, ...) and so state_dict keys are torchvision's; the
// state_dict has 122 entries: 62 parameters + 60 buffers (20 BatchNorms x 3) for 20
// convolutions (17 3x3 + 3 1x1 downsamples, no biases), 20 BatchNorms (weight, bias)
// and fc (weight, bias).
//
// Initialisation follows torchvision: conv weights kaiming_normal_(mode="fan_out",
// nonlinearity="relu"), BatchNorm weight 1 and bias 0, fc keeps Linear's default.
#pragma once

#include <memory>
#include <vector>

#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/pooling.h"

namespace loom::nn {

// Two 3x3 conv-BN pairs with a skip connection: relu(bn2(conv2(relu(bn1(conv1(x))))) + s),
// where s = x, or downsample(x) = BN(1x1 conv, stride) when the shape changes.
class BasicBlock : public Cloneable<BasicBlock> {
 public:
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride = 1);
  void reset() override;
  Tensor forward(const Tensor& input) override;

  int64_t in_planes, planes, stride;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Sequential> downsample;  // null when the shortcut is the identity
};

class ResNet : public Cloneable<ResNet> {
 public:
  // blocks: BasicBlocks per stage (4 stages); widths: channels per stage. Stage 1 keeps
  // the resolution, stages 2-4 halve it in their first block.
  ResNet(std::vector<int64_t> blocks, std::vector<int64_t> widths, int64_t num_classes = 10,
         int64_t in_channels = 3);
  void reset() override;
  Tensor forward(const Tensor& input) override;
  // The same forward as a flat Sequential sharing this model's modules (and so its
  // parameters): conv1, bn1, relu, layer1..4's blocks, avgpool, Flatten, fc. Model
  // parallelism and pipelines cut this list into stages; keys in its own state_dict are
  // positional ("0.weight"), so checkpoint through the ResNet, not through the Sequential.
  std::shared_ptr<Sequential> sequential() const;

  std::vector<int64_t> blocks, widths;
  int64_t num_classes, in_channels;
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;
};

// ResNet18 for CIFAR: blocks [2, 2, 2, 2], widths [64, 128, 256, 512].
std::shared_ptr<ResNet> resnet18(int64_t num_classes = 10);

// A small, fast model for tests and examples that must run in seconds on a CPU: the same
// architecture and names as resnet18 with one block per stage and widths
// [w, 2w, 4w, 8w] (w = 8: 78k parameters, about 1/140 of resnet18). Exercises every
// layer type and a downsample in stages 2-4, so anything that works on it (DDP, pipeline
// splits, checkpoints) works on resnet18.
std::shared_ptr<ResNet> resnet_tiny(int64_t num_classes = 10, int64_t width = 8);

}  // namespace loom::nn
