// The airbench94 network: the small VGG-like net of the CIFAR-10 speedruns (Keller Jordan's
// airbench, after David Page's and tysam-code's), which reaches 94% test accuracy in about
// ten epochs. Module names follow the layers' roles, so its state_dict reads as the
// PyTorch reference's (bench/airbench_torch.py) does:
//
//   auto net = nn::airbench94();                 // 1,972,506 parameters (1,970,778 train)
//   Tensor logits = (*net)(images);              // [N, 3, 32, 32] -> [N, 10]
//
//   whiten   Conv2d(3, 24, 2x2, bias)  -> GELU                         32 -> 31
//   block1   ConvGroup(24 -> 64)                                        31 -> 15
//   block2   ConvGroup(64 -> 256)                                       15 ->  7
//   block3   ConvGroup(256 -> 256)                                       7 ->  3
//            MaxPool2d(3) -> flatten -> head Linear(256, 10, no bias) -> x 1/9
//
//   ConvGroup: conv1 3x3 (same, no bias) -> MaxPool2d(2) -> norm1 -> GELU
//                                        -> conv2 3x3 -> norm2 -> GELU
//
// Note [airbench's layers]
// - Every 3x3 conv keeps PyTorch's default init and then dirac_ on its first in_channels
//   filters, so at initialisation each block passes its input through beside fresh
//   features: a deep net that starts close to a shallow one, which ten epochs can train.
// - The BatchNorms (eps 1e-12, momentum 0.4 in PyTorch's convention, i.e. 0.6 of the old
//   statistic kept) have their weight frozen at 1 (requires_grad false): the next conv's
//   weights carry the scale, and a trainable gain would only add a direction for the
//   weight decay to fight. Only the bias (the shift before the GELU) trains.
// - The whitening conv's weights are set from the data (nn/whitening.h) and frozen; the
//   caller does that, since it needs the training images.
// - The logits are scaled by 1/9 so that the summed loss's gradients start small.
// - sequential() lists the same layers in order (the scaling as a LogitScale), for the
//   pipelines that cut the net and the FSDP that wraps it (train_cifar10 --model airbench94).
#pragma once

#include <memory>

#include "nn/activation.h"  // defines: GELU
#include "nn/batchnorm.h"   // defines: BatchNorm2d
#include "nn/conv.h"        // defines: Conv2d
#include "nn/linear.h"      // defines: Linear, Flatten
#include "nn/pooling.h"     // defines: MaxPool2d

namespace loom::nn {

class ConvGroup : public Cloneable<ConvGroup> {
 public:
  ConvGroup(int64_t channels_in, int64_t channels_out, double batchnorm_momentum = 0.4);
  void reset() override;
  Tensor forward(const Tensor& input) override;

  int64_t channels_in, channels_out;
  double batchnorm_momentum;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<MaxPool2d> pool;
  std::shared_ptr<BatchNorm2d> norm1, norm2;
  std::shared_ptr<GELU> activ;
};

struct AirbenchOptions {
  int64_t whiten_width = 24;  // 2 * 3 * 2 * 2: each whitening filter and its negative
  int64_t block1 = 64, block2 = 256, block3 = 256;
  double batchnorm_momentum = 0.4;
  double scaling_factor = 1.0 / 9;
  int64_t num_classes = 10;
};

// Multiplies by a constant: the net's logit scaling as a layer of sequential().
class LogitScale : public Cloneable<LogitScale> {
 public:
  explicit LogitScale(double factor);
  void reset() override {}
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  double factor;
};

class AirbenchNet : public Cloneable<AirbenchNet> {
 public:
  explicit AirbenchNet(AirbenchOptions options = {});
  void reset() override;
  Tensor forward(const Tensor& input) override;
  std::shared_ptr<Sequential> sequential() const override;

  AirbenchOptions options;
  std::shared_ptr<Conv2d> whiten;
  std::shared_ptr<GELU> whiten_activ;
  std::shared_ptr<ConvGroup> block1, block2, block3;
  std::shared_ptr<MaxPool2d> pool;
  std::shared_ptr<Linear> head;
};

std::shared_ptr<AirbenchNet> airbench94(AirbenchOptions options = {});

// The trainable parameters split as the speedrun's optimizer wants them: the BatchNorm
// biases (which take a 64x larger lr and a 64x smaller weight decay) and the rest. Frozen
// parameters are in neither list.
struct AirbenchParams {
  std::vector<Tensor> norm_biases, others;
};
AirbenchParams airbench_param_split(const AirbenchNet& net);

}  // namespace loom::nn
