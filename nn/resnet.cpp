#include "nn/resnet.h"

#include <string>

#include "autograd/ops.h"  // defines: flatten
#include "nn/init.h"       // defines: kaiming_normal_

namespace loom::nn {

ResNet::ResNet(std::vector<int64_t> blocks_, std::vector<int64_t> widths_, int64_t num_classes_,
               int64_t in_channels_)
    : ResNet(std::move(blocks_), std::move(widths_), num_classes_, ResNetOptions{.in_channels = in_channels_}) {}

ResNet::ResNet(std::vector<int64_t> blocks_, std::vector<int64_t> widths_, int64_t num_classes_,
               ResNetOptions options_)
    : Cloneable("ResNet"),
      blocks(std::move(blocks_)),
      widths(std::move(widths_)),
      num_classes(num_classes_),
      in_channels(options_.in_channels),
      options(options_) {
  LOOM_CHECK(blocks.size() == 4 && widths.size() == 4, "ResNet: expected 4 stages (blocks and widths of length 4), "
             "got ", blocks.size(), " block counts and ", widths.size(), " widths");
  for (size_t i = 0; i < 4; ++i)
    LOOM_CHECK(blocks[i] > 0 && widths[i] > 0, "ResNet: stage ", i + 1, " needs at least one block and a positive "
               "width, got ", blocks[i], " blocks of width ", widths[i]);
  LOOM_CHECK(num_classes > 0, "ResNet: num_classes must be positive, got ", num_classes);
  LOOM_CHECK(in_channels > 0, "ResNet: in_channels must be positive, got ", in_channels);
  LOOM_CHECK(options.width_per_group > 0, "ResNet: width_per_group must be positive, got ", options.width_per_group);
  // torchvision's BasicBlock raises the same: its width is always planes.
  LOOM_CHECK(options.block == ResNetBlock::bottleneck || options.width_per_group == 64,
             "ResNet: BasicBlock only supports width_per_group=64, got ", options.width_per_group,
             "; use ResNetBlock::bottleneck for wide ResNets");
  reset();
}

int64_t ResNet::num_features() const {
  return widths[3] * (options.block == ResNetBlock::bottleneck ? Bottleneck::expansion : BasicBlock::expansion);
}

void ResNet::reset() {
  const bool imagenet = options.stem == ResNetStem::imagenet;
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in_channels, widths[0], imagenet ? 7 : 3, imagenet ? 2 : 1,
                                                            imagenet ? 3 : 1, 1, 1, /*bias=*/false));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(widths[0]));
  relu = register_module("relu", std::make_shared<ReLU>());
  maxpool = imagenet ? register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1)) : nullptr;
  int64_t planes_in = widths[0];
  std::shared_ptr<Sequential>* stages[] = {&layer1, &layer2, &layer3, &layer4};
  for (size_t s = 0; s < 4; ++s) {
    auto stage = std::make_shared<Sequential>();
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      if (options.block == ResNetBlock::bottleneck) {
        stage->push_back(std::make_shared<Bottleneck>(planes_in, widths[s], stride, options.width_per_group));
        planes_in = widths[s] * Bottleneck::expansion;
      } else {
        stage->push_back(std::make_shared<BasicBlock>(planes_in, widths[s], stride));
        planes_in = widths[s] * BasicBlock::expansion;
      }
    }
    *stages[s] = register_module("layer" + std::to_string(s + 1), stage);
  }
  avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<Linear>(num_features(), num_classes));
  // torchvision's initialisation (see the header); a no-op inside clone().
  apply([](Module& m) {
    if (auto* conv = dynamic_cast<Conv2d*>(&m)) init::kaiming_normal_(conv->weight, 0.0, "fan_out", "relu");
  });
}

Tensor ResNet::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == in_channels, "ResNet: expected images of shape [N, ", in_channels,
             ", H, W], got ", input.shape());
  Tensor x = bn1->forward_relu((*conv1)(input));  // relu(bn1(conv1(input))), fused
  if (maxpool) x = (*maxpool)(x);
  x = (*layer4)((*layer3)((*layer2)((*layer1)(x))));
  return (*fc)(flatten((*avgpool)(x), 1));
}

std::shared_ptr<Sequential> ResNet::sequential() const {
  auto seq = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{conv1, bn1, relu});
  if (maxpool) seq->push_back(maxpool);
  for (const auto& stage : {layer1, layer2, layer3, layer4})
    for (const auto& block : stage->children()) seq->push_back(block);
  seq->push_back(avgpool);
  seq->push_back(std::make_shared<Flatten>(1));
  seq->push_back(fc);
  seq->train(is_training());
  return seq;
}

namespace {

std::shared_ptr<ResNet> make_resnet(std::vector<int64_t> blocks, ResNetBlock block, int64_t num_classes,
                                    ResNetStem stem, int64_t width_per_group = 64) {
  return std::make_shared<ResNet>(std::move(blocks), std::vector<int64_t>{64, 128, 256, 512}, num_classes,
                                  ResNetOptions{.block = block, .stem = stem, .width_per_group = width_per_group});
}

}  // namespace

std::shared_ptr<ResNet> resnet18(int64_t num_classes, ResNetStem stem) {
  return make_resnet({2, 2, 2, 2}, ResNetBlock::basic, num_classes, stem);
}
std::shared_ptr<ResNet> resnet34(int64_t num_classes, ResNetStem stem) {
  return make_resnet({3, 4, 6, 3}, ResNetBlock::basic, num_classes, stem);
}
std::shared_ptr<ResNet> resnet50(int64_t num_classes, ResNetStem stem) {
  return make_resnet({3, 4, 6, 3}, ResNetBlock::bottleneck, num_classes, stem);
}
std::shared_ptr<ResNet> resnet101(int64_t num_classes, ResNetStem stem) {
  return make_resnet({3, 4, 23, 3}, ResNetBlock::bottleneck, num_classes, stem);
}
std::shared_ptr<ResNet> resnet152(int64_t num_classes, ResNetStem stem) {
  return make_resnet({3, 8, 36, 3}, ResNetBlock::bottleneck, num_classes, stem);
}
std::shared_ptr<ResNet> wide_resnet50_2(int64_t num_classes, ResNetStem stem) {
  return make_resnet({3, 4, 6, 3}, ResNetBlock::bottleneck, num_classes, stem, /*width_per_group=*/128);
}
std::shared_ptr<ResNet> wide_resnet101_2(int64_t num_classes, ResNetStem stem) {
  return make_resnet({3, 4, 23, 3}, ResNetBlock::bottleneck, num_classes, stem, /*width_per_group=*/128);
}

std::shared_ptr<ResNet> resnet_tiny(int64_t num_classes, int64_t width) {
  return std::make_shared<ResNet>(std::vector<int64_t>{1, 1, 1, 1},
                                  std::vector<int64_t>{width, 2 * width, 4 * width, 8 * width}, num_classes);
}

}  // namespace loom::nn
