// nn::init: in-place initialisers for parameters, as torch.nn.init.
//
//   nn::init::kaiming_normal_(conv->weight, 0, "fan_out", "relu");
//   nn::init::zeros_(conv->bias);
//
// Every function fills the tensor in place under NoGradGuard (so it works on leaves that
// require grad), draws from `gen` or the default generator (loom::manual_seed), and
// returns the tensor. Names, arguments and formulas follow PyTorch exactly; only the
// random stream differs (loom's counter-based Generator, see core/generator.h).
#pragma once

#include <string>
#include <utility>

#include "core/generator.h"
#include "core/tensor.h"

namespace loom::nn::init {

// The recommended gain for a nonlinearity: "linear", "conv2d", "sigmoid" -> 1,
// "tanh" -> 5/3, "relu" -> sqrt(2), "leaky_relu" -> sqrt(2 / (1 + param^2)),
// "selu" -> 3/4. (torch.nn.init.calculate_gain)
double calculate_gain(const std::string& nonlinearity, double param = 0.01);

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field, where the
// receptive field is the product of dims 2.. (kernel height x width for a conv weight).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

const Tensor& uniform_(const Tensor& tensor, double a = 0.0, double b = 1.0, Generator* gen = nullptr);
const Tensor& normal_(const Tensor& tensor, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
// Normal(mean, std) values redrawn until they fall in [a, b] (the bounds are absolute, not in
// stds, as PyTorch's: timm's ViT init is trunc_normal_(w, 0, 0.02), which with the default
// [-2, 2] cuts nothing in practice). The same distribution as PyTorch's inverse-CDF method.
const Tensor& trunc_normal_(const Tensor& tensor, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                            Generator* gen = nullptr);
const Tensor& constant_(const Tensor& tensor, double value);
const Tensor& zeros_(const Tensor& tensor);
const Tensor& ones_(const Tensor& tensor);

// He et al. 2015: std = gain / sqrt(fan) with gain = calculate_gain(nonlinearity, a);
// uniform draws from U(-sqrt(3) * std, sqrt(3) * std). mode is "fan_in" or "fan_out".
// See Note [Default layer initialisation] for why Conv2d/Linear call this with a = sqrt(5).
const Tensor& kaiming_uniform_(const Tensor& tensor, double a = 0.0, const std::string& mode = "fan_in",
                               const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
const Tensor& kaiming_normal_(const Tensor& tensor, double a = 0.0, const std::string& mode = "fan_in",
                              const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
// Glorot & Bengio 2010: std = gain * sqrt(2 / (fan_in + fan_out)).
const Tensor& xavier_uniform_(const Tensor& tensor, double gain = 1.0, Generator* gen = nullptr);
const Tensor& xavier_normal_(const Tensor& tensor, double gain = 1.0, Generator* gen = nullptr);

// The identity convolution (Zagoruyko & Komodakis's DiracNets), as torch.nn.init.dirac_:
// zeros, then weight[g * out_per_group + d, d, centre...] = 1 for each of `groups` groups and
// d < min(out_channels / groups, in_channels). A 3-5-D weight [out, in, k...]; a conv so
// initialised passes its input (its first channels) through unchanged. Even kernels put the
// 1 at index k / 2, as PyTorch. airbench's convs apply it to their first in_channels filters:
//   nn::init::dirac_(conv->weight.narrow(0, 0, conv->weight.size(1)));
const Tensor& dirac_(const Tensor& tensor, int64_t groups = 1);

// Note [Default layer initialisation]
// PyTorch initialises Conv2d and Linear weights with kaiming_uniform_(a = sqrt(5)):
// gain = sqrt(2 / (1 + 5)) = sqrt(1/3), std = gain / sqrt(fan_in), bound = sqrt(3) * std
// = 1 / sqrt(fan_in); so weights are U(-1/sqrt(fan_in), 1/sqrt(fan_in)), where fan_in is
// in_features, or in_channels / groups * kh * kw. Biases draw from the same interval.
// loom does exactly the same (only the random stream differs), so a layer's output scale
// at initialisation, and therefore training behaviour, matches PyTorch's.
// `bias` may be undefined (bias=false).
void default_layer_init_(const Tensor& weight, const Tensor& bias);

// Note [Skipping initialisation]
// Module::clone() builds a module of the same structure and then overwrites every
// parameter and buffer with the source's values, so initialising them first would only
// burn time (11M random numbers for ResNet18, per replica, per step under DataParallel)
// and advance the default generator, which would make a run with replicas draw different
// random numbers (dropout masks, later inits) than the same run without. While a
// NoInitGuard is alive on this thread, every function above leaves the tensor untouched.
class NoInitGuard {
 public:
  NoInitGuard();
  ~NoInitGuard();
  NoInitGuard(const NoInitGuard&) = delete;
  NoInitGuard& operator=(const NoInitGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

}  // namespace loom::nn::init
