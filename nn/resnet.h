// torchvision's ResNet family, with its module names and so its state_dict keys:
//
//   auto model = nn::resnet18(/*num_classes=*/10);                 // CIFAR stem: 11,173,962 parameters
//   auto big = nn::resnet50(1000, nn::ResNetStem::imagenet);       // torchvision's resnet50: 25,557,032
//   Tensor logits = (*model)(images);                              // [N, 3, 32, 32] -> [N, 10]
//
//   model             block       blocks per stage   width_per_group   parameters (ImageNet stem, 1000 classes)
//   resnet18          BasicBlock  2  2  2  2         64                11,689,512
//   resnet34          BasicBlock  3  4  6  3         64                21,797,672
//   resnet50          Bottleneck  3  4  6  3         64                25,557,032
//   resnet101         Bottleneck  3  4 23  3         64                44,549,160
//   resnet152         Bottleneck  3  8 36  3         64                60,192,808
//   wide_resnet50_2   Bottleneck  3  4  6  3         128               68,883,240
//   wide_resnet101_2  Bottleneck  3  4 23  3         128               126,886,696
//
// Note [ResNet stems]: the default stem is the CIFAR one, a 3x3 conv with stride 1 and no
// max-pool, so that 32x32 images are not shrunk to 8x8 before the first block; stages then
// run at 32, 16, 8 and 4 pixels. ResNetStem::imagenet is torchvision's: a 7x7 stride-2 conv
// and a 3x3 stride-2 max-pool, for 224x224 images. Only conv1's kernel differs in the
// state_dict (the max-pool has no state), so the CIFAR stem has 3 * 64 * (49 - 9) = 7,680
// parameters fewer than the table above.
//
// The CIFAR resnet18's state_dict has 122 entries: 62 parameters + 60 buffers (20 BatchNorms
// x 3) for 20 convolutions (17 3x3 + 3 1x1 downsamples, no biases), 20 BatchNorms (weight,
// bias) and fc (weight, bias). The blocks are in nn/resnet_blocks.h.
//
// Initialisation follows torchvision: conv weights kaiming_normal_(mode="fan_out",
// nonlinearity="relu"), BatchNorm weight 1 and bias 0, fc keeps Linear's default.
#pragma once

#include <memory>
#include <vector>

#include "nn/activation.h"     // defines: ReLU
#include "nn/batchnorm.h"      // defines: BatchNorm2d
#include "nn/container.h"      // defines: Sequential
#include "nn/conv.h"           // defines: Conv2d
#include "nn/linear.h"         // defines: Linear, Flatten
#include "nn/pooling.h"        // defines: MaxPool2d, AdaptiveAvgPool2d
#include "nn/resnet_blocks.h"  // defines: BasicBlock, Bottleneck

namespace loom::nn {

// torchvision's `block` argument: which residual block each stage stacks.
enum class ResNetBlock { basic, bottleneck };
// See Note [ResNet stems].
enum class ResNetStem { cifar, imagenet };

struct ResNetOptions {
  ResNetBlock block = ResNetBlock::basic;
  ResNetStem stem = ResNetStem::cifar;
  int64_t width_per_group = 64;  // Bottleneck's base_width; BasicBlock supports only 64
  int64_t in_channels = 3;
};

class ResNet : public Cloneable<ResNet> {
 public:
  // blocks: blocks per stage (4 stages); widths: each stage's `planes` (its output has
  // planes * expansion channels). Stage 1 keeps the resolution, stages 2-4 halve it in their
  // first block.
  ResNet(std::vector<int64_t> blocks, std::vector<int64_t> widths, int64_t num_classes = 10,
         int64_t in_channels = 3);
  ResNet(std::vector<int64_t> blocks, std::vector<int64_t> widths, int64_t num_classes, ResNetOptions options);
  void reset() override;
  Tensor forward(const Tensor& input) override;
  // The same forward as a flat Sequential sharing this model's modules (and so its
  // parameters): conv1, bn1, relu, [maxpool,] layer1..4's blocks, avgpool, Flatten, fc.
  // Model parallelism and pipelines cut this list into stages, one block per layer; keys in
  // its own state_dict are positional ("0.weight"), so checkpoint through the ResNet, not
  // through the Sequential.
  std::shared_ptr<Sequential> sequential() const override;
  // Channels into fc: widths[3] * the block's expansion.
  int64_t num_features() const;

  std::vector<int64_t> blocks, widths;
  int64_t num_classes, in_channels;
  ResNetOptions options;
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<MaxPool2d> maxpool;  // null with the CIFAR stem
  std::shared_ptr<Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;
};

// The family in the table above; widths [64, 128, 256, 512] (torchvision's).
std::shared_ptr<ResNet> resnet18(int64_t num_classes = 10, ResNetStem stem = ResNetStem::cifar);
std::shared_ptr<ResNet> resnet34(int64_t num_classes = 10, ResNetStem stem = ResNetStem::cifar);
std::shared_ptr<ResNet> resnet50(int64_t num_classes = 10, ResNetStem stem = ResNetStem::cifar);
std::shared_ptr<ResNet> resnet101(int64_t num_classes = 10, ResNetStem stem = ResNetStem::cifar);
std::shared_ptr<ResNet> resnet152(int64_t num_classes = 10, ResNetStem stem = ResNetStem::cifar);
std::shared_ptr<ResNet> wide_resnet50_2(int64_t num_classes = 10, ResNetStem stem = ResNetStem::cifar);
std::shared_ptr<ResNet> wide_resnet101_2(int64_t num_classes = 10, ResNetStem stem = ResNetStem::cifar);

// A small, fast model for tests and examples that must run in seconds on a CPU: the same
// architecture and names as resnet18 with one block per stage and widths
// [w, 2w, 4w, 8w] (w = 8: 78k parameters, about 1/140 of resnet18). Exercises every
// layer type and a downsample in stages 2-4, so anything that works on it (DDP, pipeline
// splits, checkpoints) works on resnet18.
std::shared_ptr<ResNet> resnet_tiny(int64_t num_classes = 10, int64_t width = 8);

}  // namespace loom::nn
