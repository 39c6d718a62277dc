#include "nn/resnet.h"

#include "autograd/ops.h"

namespace loom::nn {

BasicBlock::BasicBlock(int64_t in_planes_, int64_t planes_, int64_t stride_)
    : Cloneable("BasicBlock"), in_planes(in_planes_), planes(planes_), stride(stride_) {
  reset();
}

void BasicBlock::reset() {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in_planes, planes, 3, stride, 1, 1, 1, /*bias=*/false));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  relu = register_module("relu", std::make_shared<ReLU>());
  conv2 = register_module("conv2", std::make_shared<Conv2d>(planes, planes, 3, 1, 1, 1, 1, /*bias=*/false));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  downsample = nullptr;
  if (stride != 1 || in_planes != planes) {
    downsample = register_module("downsample", std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
        std::make_shared<Conv2d>(in_planes, planes, 1, stride, 0, 1, 1, /*bias=*/false),
        std::make_shared<BatchNorm2d>(planes)}));
  }
}

// relu(bn(.)) and relu(bn(.) + shortcut) run as single fused ops (BatchNorm2d::
// forward_relu, Note [Fused BatchNorm epilogue]): the same values, two fewer passes over
// each activation. The relu module stays for the module tree and the state_dict layout.
Tensor BasicBlock::forward(const Tensor& input) {
  Tensor out = (*conv2)(bn1->forward_relu((*conv1)(input)));
  Tensor shortcut = downsample ? (*downsample)(input) : input;
  return bn2->forward_relu(out, shortcut);
}

ResNet::ResNet(std::vector<int64_t> blocks_, std::vector<int64_t> widths_, int64_t num_classes_,
               int64_t in_channels_)
    : Cloneable("ResNet"),
      blocks(std::move(blocks_)),
      widths(std::move(widths_)),
      num_classes(num_classes_),
      in_channels(in_channels_) {
  LOOM_CHECK(blocks.size() == 4 && widths.size() == 4, "ResNet: expected 4 stages (blocks and widths of length 4), "
             "got ", blocks.size(), " block counts and ", widths.size(), " widths");
  for (size_t i = 0; i < 4; ++i)
    LOOM_CHECK(blocks[i] > 0 && widths[i] > 0, "ResNet: stage ", i + 1, " needs at least one block and a positive "
               "width, got ", blocks[i], " blocks of width ", widths[i]);
  LOOM_CHECK(num_classes > 0, "ResNet: num_classes must be positive, got ", num_classes);
  reset();
}

void ResNet::reset() {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in_channels, widths[0], 3, 1, 1, 1, 1, /*bias=*/false));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(widths[0]));
  relu = register_module("relu", std::make_shared<ReLU>());
  int64_t planes_in = widths[0];
  std::shared_ptr<Sequential>* stages[] = {&layer1, &layer2, &layer3, &layer4};
  for (size_t s = 0; s < 4; ++s) {
    auto stage = std::make_shared<Sequential>();
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stage->push_back(std::make_shared<BasicBlock>(planes_in, widths[s], stride));
      planes_in = widths[s];
    }
    *stages[s] = register_module("layer" + std::to_string(s + 1), stage);
  }
  avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  fc = register_module("fc", std::make_shared<Linear>(widths[3], num_classes));
  // torchvision's initialisation (see the header); a no-op inside clone().
  apply([](Module& m) {
    if (auto* conv = dynamic_cast<Conv2d*>(&m)) init::kaiming_normal_(conv->weight, 0.0, "fan_out", "relu");
  });
}

Tensor ResNet::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == in_channels, "ResNet: expected images of shape [N, ", in_channels,
             ", H, W], got ", input.shape());
  Tensor x = bn1->forward_relu((*conv1)(input));  // relu(bn1(conv1(input))), fused
  x = (*layer4)((*layer3)((*layer2)((*layer1)(x))));
  return (*fc)(flatten((*avgpool)(x), 1));
}

std::shared_ptr<Sequential> ResNet::sequential() const {
  auto seq = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{conv1, bn1, relu});
  for (const auto& stage : {layer1, layer2, layer3, layer4})
    for (const auto& block : stage->children()) seq->push_back(block);
  seq->push_back(avgpool);
  seq->push_back(std::make_shared<Flatten>(1));
  seq->push_back(fc);
  seq->train(is_training());
  return seq;
}

std::shared_ptr<ResNet> resnet18(int64_t num_classes) {
  return std::make_shared<ResNet>(std::vector<int64_t>{2, 2, 2, 2}, std::vector<int64_t>{64, 128, 256, 512},
                                  num_classes);
}

std::shared_ptr<ResNet> resnet_tiny(int64_t num_classes, int64_t width) {
  return std::make_shared<ResNet>(std::vector<int64_t>{1, 1, 1, 1},
                                  std::vector<int64_t>{width, 2 * width, 4 * width, 8 * width}, num_classes);
}

}  // namespace loom::nn
