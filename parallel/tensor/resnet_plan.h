// The tensor-parallel plan of a ResNet: Megatron's MLP pattern with convolutions.
//
//   parallelize_module(*model, tp, resnet_tp_plan(*model));
//
// In each BasicBlock (docs/tensor_parallel.md draws it with every tensor's placement):
//
//   x (Replicate) --f--> conv1: ColwiseParallel, its output channels split  -> Shard(1)
//                        bn1:   ChannelParallel, relu: each rank its channels -> Shard(1)
//                        conv2: RowwiseParallel, its input channels split -> Partial --g--> Replicate
//                        bn2 (+ shortcut), relu: whole, alike on every rank -> Replicate
//
// so a block costs one all-reduce of its output forward (g) and one of its input's
// gradient backward (f), and each rank holds 1/tp of both 3x3 convolutions and of bn1.
// The stem, the shortcuts' 1x1 convolutions and the head stay whole (Note [What the ResNet
// plan leaves whole]). A Bottleneck gets the same three entries; its conv3 and bn3 run
// whole after the reduction (Note [The Bottleneck's split]).
#pragma once

#include "nn/resnet.h"                           // defines: ResNet, BasicBlock, Bottleneck
#include "parallel/tensor/parallelize_module.h"  // defines: ParallelizePlan

namespace loom::distributed {

ParallelizePlan resnet_tp_plan(const nn::ResNet& model);

}  // namespace loom::distributed
