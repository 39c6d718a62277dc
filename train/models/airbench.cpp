// The speedrun net (nn/airbench.h) as the trainer sees it: train_cifar10 --model airbench94
// trains its architecture in any parallel mode. The speedrun's own recipe (the whitening
// conv set from the data, lookahead, label smoothing, TTA: examples/airbench) is not the
// trainer's; here the whitening conv keeps its initial weights, frozen as the net makes it.
#include "nn/airbench.h"  // defines: AirbenchNet, ConvGroup
#include "train/model_spec.h"

namespace loom::training {

ModelSpec airbench_spec() {
  return {
      .family = "airbench",
      .names = {"airbench94"},
      .build = [](const std::string&, int64_t num_classes) { return nn::airbench94({.num_classes = num_classes}); },
      // Its three conv groups: units of FSDP and of activation checkpointing.
      .block_types = {"ConvGroup"},
      // A ResNet block's plan (parallel/tensor/resnet_plan.h) on each group: conv1's output
      // channels split, the pooling, norm1 and GELU each rank on its channels, conv2's input
      // channels split and its partial sums all-reduced; norm2 and the rest whole.
      .tp_plan = [](const nn::Module&, int) {
        return distributed::ParallelizePlan{{"block*.conv1", distributed::ColwiseParallel()},
                                            {"block*.norm1", distributed::ChannelParallel()},
                                            {"block*.conv2", distributed::RowwiseParallel()}};
      },
      .no_weight_decay = nullptr,
  };
}

}  // namespace loom::training
