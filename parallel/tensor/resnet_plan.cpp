#include "parallel/tensor/resnet_plan.h"

#include "core/error.h"  // defines: LOOM_CHECK

namespace loom::distributed {

// Note [What the ResNet plan leaves whole]
// The stem conv1 has 3 input channels and 1,728 weights: split, it would save nothing and
// add two collectives to every step. A shortcut's 1x1 convolution reads the block's whole
// input and adds to bn2's whole output; split either way, it needs an all-reduce or an
// all-gather of a tensor as large as the block's output for 1/9 of a 3x3 conv's weights.
// The head (fc, 5,130 weights) is the same story. What is split is where the weights are:
// the 3x3 convolutions of the blocks hold 98% of resnet18's parameters, and bn1 comes with them.
// Note [The Bottleneck's split]
// A Bottleneck is conv1 (1x1, in -> w), conv2 (3x3, w -> w), conv3 (1x1, w -> 4w). The same
// three entries as a BasicBlock's split conv1 by its outputs and conv2 by its inputs, and
// reduce conv2's output (w channels) before bn2; conv3 and bn3 run whole. The other pair,
// conv2 column- and conv3 row-parallel, splits as many weights (9w^2 + 4w^2 either way,
// with in = 4w) but all-reduces conv3's 4w channels forward instead of conv2's w: this
// one moves its larger tensor (the block input's gradient, in channels) backward instead.
ParallelizePlan resnet_tp_plan(const nn::ResNet& model) {
  for (const auto& stage : {model.layer1, model.layer2, model.layer3, model.layer4})
    for (const auto& block : stage->children())
      LOOM_CHECK(dynamic_cast<const nn::BasicBlock*>(block.get()) != nullptr ||
                     dynamic_cast<const nn::Bottleneck*>(block.get()) != nullptr,
                 "resnet_tp_plan: the plan splits BasicBlocks and Bottlenecks (conv1 column-parallel, conv2 "
                 "row-parallel); this ResNet has a ", block->type_name());
  return {
      {"layer*.*.conv1", ColwiseParallel()},
      {"layer*.*.bn1", ChannelParallel()},
      {"layer*.*.conv2", RowwiseParallel()},
  };
}

}  // namespace loom::distributed
