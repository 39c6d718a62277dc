#include "nn/airbench.h"

#include "autograd/ops.h"  // defines: flatten
#include "nn/container.h"  // defines: Sequential (sequential())
#include "nn/init.h"       // defines: dirac_

namespace loom::nn {

namespace {

// A 3x3 conv with "same" padding and no bias, initialised as airbench's: PyTorch's default,
// then the identity on its first in_channels filters (Note [airbench's layers]).
std::shared_ptr<Conv2d> dirac_conv(int64_t in, int64_t out) {
  auto conv = std::make_shared<Conv2d>(in, out, 3, 1, 1, 1, 1, /*bias=*/false);
  init::dirac_(conv->weight.narrow(0, 0, std::min(in, out)));
  return conv;
}

std::shared_ptr<BatchNorm2d> frozen_weight_norm(int64_t channels, double momentum) {
  auto norm = std::make_shared<BatchNorm2d>(channels, /*eps=*/1e-12, momentum);
  norm->weight.requires_grad_(false);  // See Note [airbench's layers]
  return norm;
}

}  // namespace

ConvGroup::ConvGroup(int64_t channels_in_, int64_t channels_out_, double batchnorm_momentum_)
    : Cloneable("ConvGroup"),
      channels_in(channels_in_),
      channels_out(channels_out_),
      batchnorm_momentum(batchnorm_momentum_) {
  LOOM_CHECK(channels_in > 0 && channels_out > 0, "ConvGroup: channels must be positive, got ", channels_in, " -> ",
             channels_out);
  reset();
}

void ConvGroup::reset() {
  conv1 = register_module("conv1", dirac_conv(channels_in, channels_out));
  pool = register_module("pool", std::make_shared<MaxPool2d>(2));
  norm1 = register_module("norm1", frozen_weight_norm(channels_out, batchnorm_momentum));
  conv2 = register_module("conv2", dirac_conv(channels_out, channels_out));
  norm2 = register_module("norm2", frozen_weight_norm(channels_out, batchnorm_momentum));
  activ = register_module("activ", std::make_shared<GELU>());
}

Tensor ConvGroup::forward(const Tensor& input) {
  // module(x), not module->forward(x): tensor parallelism's styles are forward hooks
  // (Note [Forward hooks run in module(x)]).
  Tensor x = (*activ)((*norm1)((*pool)((*conv1)(input))));
  return (*activ)((*norm2)((*conv2)(x)));
}

AirbenchNet::AirbenchNet(AirbenchOptions options_) : Cloneable("AirbenchNet"), options(options_) {
  LOOM_CHECK(options.whiten_width > 0 && options.block1 > 0 && options.block2 > 0 && options.block3 > 0 &&
                 options.num_classes > 0,
             "AirbenchNet: widths and num_classes must be positive");
  reset();
}

void AirbenchNet::reset() {
  whiten = register_module("whiten", std::make_shared<Conv2d>(3, options.whiten_width, 2, 1, 0));
  init::zeros_(whiten->bias);  // its weight comes from the data (nn/whitening.h)
  whiten_activ = register_module("whiten_activ", std::make_shared<GELU>());
  block1 = register_module("block1", std::make_shared<ConvGroup>(options.whiten_width, options.block1,
                                                                  options.batchnorm_momentum));
  block2 = register_module("block2", std::make_shared<ConvGroup>(options.block1, options.block2,
                                                                  options.batchnorm_momentum));
  block3 = register_module("block3", std::make_shared<ConvGroup>(options.block2, options.block3,
                                                                  options.batchnorm_momentum));
  pool = register_module("pool", std::make_shared<MaxPool2d>(3));
  head = register_module("head", std::make_shared<Linear>(options.block3, options.num_classes, /*bias=*/false));
}

Tensor AirbenchNet::forward(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4 && input.size(1) == 3, "AirbenchNet: expected images [N, 3, H, W], got shape ",
             input.shape());
  Tensor x = (*whiten_activ)((*whiten)(input));
  x = (*block3)((*block2)((*block1)(x)));
  x = flatten((*pool)(x), 1);
  LOOM_CHECK(x.size(1) == options.block3, "AirbenchNet: expected 32x32 images (3x3 before the last pool), got ",
             input.size(2), "x", input.size(3));
  return (*head)(x) * options.scaling_factor;
}

std::shared_ptr<Sequential> AirbenchNet::sequential() const {
  auto seq = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      whiten, whiten_activ, block1, block2, block3, pool, std::make_shared<Flatten>(1), head,
      std::make_shared<LogitScale>(options.scaling_factor)});
  seq->train(is_training());
  return seq;
}

LogitScale::LogitScale(double factor_) : Cloneable("LogitScale"), factor(factor_) {}

Tensor LogitScale::forward(const Tensor& input) { return input * factor; }

std::string LogitScale::extra_repr() const { return detail::str("factor=", factor); }

std::shared_ptr<AirbenchNet> airbench94(AirbenchOptions options) { return std::make_shared<AirbenchNet>(options); }

AirbenchParams airbench_param_split(const AirbenchNet& net) {
  AirbenchParams split;
  for (const auto& [name, p] : net.named_parameters()) {
    if (!p.requires_grad()) continue;
    const bool norm_bias = name.find(".norm") != std::string::npos && name.ends_with(".bias");
    (norm_bias ? split.norm_biases : split.others).push_back(p);
  }
  return split;
}

}  // namespace loom::nn
