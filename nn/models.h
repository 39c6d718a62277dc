// Models by name, as torchvision.models.get_model: what `train_cifar10 --model NAME` builds.
//
//   auto model = nn::make_model("resnet50", {.num_classes = 10});   // CIFAR stem
//   auto big = nn::make_model("resnet50", {.num_classes = 1000, .stem = nn::ResNetStem::imagenet});
//   nn::model_names();   // {"resnet18", "resnet34", ..., "tiny", "vit_tiny", "vit_small"}
//
// An unknown name is an error listing every registered one. A new model family registers
// one line in the table in models.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"     // defines: Module
#include "nn/container.h"  // defines: Sequential
#include "nn/resnet.h"     // defines: ResNetStem

namespace loom::nn {

struct ModelArgs {
  int64_t num_classes = 10;
  ResNetStem stem = ResNetStem::cifar;  // ResNets only (Note [ResNet stems])
};

std::shared_ptr<Module> make_model(const std::string& name, const ModelArgs& args = {});
// The registered names, in the order the error message and --help list them.
std::vector<std::string> model_names();

// The model's layers as a flat Sequential sharing its modules (ResNet::sequential(),
// VisionTransformer::sequential()): what pipelines cut into stages and FSDP wraps unit by
// unit. An error naming the model for one that has no such view.
std::shared_ptr<Sequential> sequential_view(const Module& model);

}  // namespace loom::nn
