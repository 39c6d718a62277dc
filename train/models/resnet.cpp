// The ResNet family (nn/resnet.h) as the trainer sees it: torchvision's names with the
// CIFAR stem, and "tiny" (one narrow block per stage) for tests and demos.
#include "nn/models.h"                  // defines: make_model (torchvision's names)
#include "nn/resnet.h"                  // defines: ResNet
#include "parallel/tensor/resnet_plan.h"  // defines: resnet_tp_plan
#include "train/model_spec.h"

namespace loom::training {

ModelSpec resnet_spec() {
  return {
      .family = "resnet",
      .names = {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "wide_resnet50_2", "wide_resnet101_2",
                "resnet_tiny", "tiny"},
      .build = [](const std::string& name, int64_t num_classes) { return nn::make_model(name, {.num_classes = num_classes}); },
      // Residual blocks: units of FSDP and of activation checkpointing.
      .block_types = {"BasicBlock", "Bottleneck"},
      // Every block's conv1 column-parallel, bn1 on its channels, conv2 row-parallel.
      .tp_plan = for_model<nn::ResNet>([](const nn::ResNet& m, int) { return distributed::resnet_tp_plan(m); }),
      .no_weight_decay = nullptr,
  };
}

}  // namespace loom::training
