#include "nn/init.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"  // defines: where, lt, gt, sum (trunc_normal_'s redraws)
#include "core/copy.h"
#include "core/factory.h"
#include "core/kernels.h"

namespace loom::nn::init {
namespace {

thread_local bool skip_init = false;

// Fills `tensor` through a kernel that needs contiguous memory; a strided view is filled
// through a contiguous scratch tensor and copied back.
template <typename Fill>
const Tensor& fill_in_place(const char* name, const Tensor& tensor, Fill fill) {
  LOOM_CHECK(tensor.defined(), "nn::init::", name, ": the tensor is undefined (a layer built with bias=false has "
             "no bias to initialise)");
  if (skip_init || tensor.numel() == 0) return tensor;  // See Note [Skipping initialisation]
  NoGradGuard no_grad;
  Tensor target = tensor.detach();
  if (target.is_contiguous()) {
    fill(target);
  } else {
    Tensor scratch = empty(target.shape(), TensorOptions(target.dtype()).device(target.device()));
    fill(scratch);
    copy_into(target, scratch);
  }
  tensor.bump_version();
  return tensor;
}

int64_t fan_for_mode(const Tensor& tensor, const std::string& mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  if (mode == "fan_in") return fan_in;
  if (mode == "fan_out") return fan_out;
  LOOM_FAIL("nn::init: mode must be \"fan_in\" or \"fan_out\", got \"", mode, "\"");
}

double kaiming_std(const Tensor& tensor, double a, const std::string& mode, const std::string& nonlinearity) {
  const int64_t fan = fan_for_mode(tensor, mode);
  LOOM_CHECK(fan > 0, "nn::init::kaiming: cannot initialise a tensor with zero elements (shape ", tensor.shape(), ")");
  return calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
}

double xavier_std(const Tensor& tensor, double gain) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(tensor);
  return gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
}

}  // namespace

NoInitGuard::NoInitGuard() : previous_(skip_init) { skip_init = true; }
NoInitGuard::~NoInitGuard() { skip_init = previous_; }
bool NoInitGuard::active() { return skip_init; }

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == "linear" || nonlinearity == "conv2d" || nonlinearity == "sigmoid" ||
      nonlinearity == "conv1d" || nonlinearity == "conv3d")
    return 1.0;
  if (nonlinearity == "tanh") return 5.0 / 3.0;
  if (nonlinearity == "relu") return std::sqrt(2.0);
  if (nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == "selu") return 3.0 / 4.0;
  LOOM_FAIL("nn::init::calculate_gain: unsupported nonlinearity \"", nonlinearity,
            "\"; expected one of linear, conv2d, sigmoid, tanh, relu, leaky_relu, selu");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor) {
  LOOM_CHECK(tensor.dim() >= 2, "nn::init: fan in and fan out can not be computed for a tensor with fewer than 2 "
             "dimensions, got shape ", tensor.shape());
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < tensor.dim(); ++d) receptive_field *= tensor.size(d);
  return {tensor.size(1) * receptive_field, tensor.size(0) * receptive_field};
}

const Tensor& uniform_(const Tensor& tensor, double a, double b, Generator* gen) {
  LOOM_CHECK(a <= b, "nn::init::uniform_: expected a <= b, got a=", a, " b=", b);
  return fill_in_place("uniform_", tensor, [&](Tensor& t) {
    uniform_kernel(t.device())(t, a, b, gen ? *gen : default_generator());
  });
}

const Tensor& normal_(const Tensor& tensor, double mean, double std, Generator* gen) {
  LOOM_CHECK(std >= 0, "nn::init::normal_: std must be non-negative, got ", std);
  return fill_in_place("normal_", tensor, [&](Tensor& t) {
    normal_kernel(t.device())(t, mean, std, gen ? *gen : default_generator());
  });
}

const Tensor& trunc_normal_(const Tensor& tensor, double mean, double std, double a, double b, Generator* gen) {
  LOOM_CHECK(std >= 0, "nn::init::trunc_normal_: std must be non-negative, got ", std);
  LOOM_CHECK(a < b, "nn::init::trunc_normal_: expected a < b, got a=", a, " b=", b);
  return fill_in_place("trunc_normal_", tensor, [&](Tensor& t) {
    Generator& g = gen ? *gen : default_generator();
    normal_kernel(t.device())(t, mean, std, g);
    const Tensor lo = scalar_tensor(a, TensorOptions(t.dtype()).device(t.device()));
    const Tensor hi = scalar_tensor(b, TensorOptions(t.dtype()).device(t.device()));
    // Rejection: each round redraws the values outside [a, b]. An interval holding
    // little of the distribution would need many rounds; such a request is an error.
    for (int round = 0;; ++round) {
      const Tensor outside = where(lt(t, lo), lt(t, lo), gt(t, hi));
      if (sum(outside.to(kFloat32)).item<float>() == 0) break;
      LOOM_CHECK(round < 100, "nn::init::trunc_normal_: [", a, ", ", b, "] holds too little of Normal(", mean, ", ",
                 std, ") to draw from by rejection; widen the interval");
      Tensor fresh = empty(t.shape(), TensorOptions(t.dtype()).device(t.device()));
      normal_kernel(t.device())(fresh, mean, std, g);
      copy_into(t, where(outside, fresh, t));
    }
  });
}

const Tensor& constant_(const Tensor& tensor, double value) {
  return fill_in_place("constant_", tensor, [&](Tensor& t) { fill_kernel(t.device())(t, value); });
}
const Tensor& zeros_(const Tensor& tensor) { return constant_(tensor, 0.0); }
const Tensor& ones_(const Tensor& tensor) { return constant_(tensor, 1.0); }

const Tensor& dirac_(const Tensor& tensor, int64_t groups) {
  LOOM_CHECK(tensor.defined(), "nn::init::dirac_: the tensor is undefined");
  LOOM_CHECK(tensor.dim() >= 3 && tensor.dim() <= 5, "nn::init::dirac_: only tensors with 3, 4, or 5 dimensions "
             "are supported (a conv weight [out, in, k...]), got shape ", tensor.shape());
  LOOM_CHECK(groups > 0 && tensor.size(0) % groups == 0, "nn::init::dirac_: dim 0 (", tensor.size(0),
             ") must be divisible by groups (", groups, ")");
  const int64_t out_per_group = tensor.size(0) / groups;
  const int64_t in = tensor.size(1);
  int64_t kernel_numel = 1, centre = 0;  // centre: the flat index of (k0/2, k1/2, ...) in the kernel
  for (int64_t d = 2; d < tensor.dim(); ++d) {
    centre = centre * tensor.size(d) + tensor.size(d) / 2;
    kernel_numel *= tensor.size(d);
  }
  // Built on the CPU in float64 and copied in, whatever the tensor's device and dtype: the
  // values are 0 and 1, exact in every dtype.
  std::vector<double> values(static_cast<size_t>(tensor.numel()), 0.0);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t d = 0; d < std::min(out_per_group, in); ++d)
      values[static_cast<size_t>(((g * out_per_group + d) * in + d) * kernel_numel + centre)] = 1.0;
  const Tensor source = from_vector(values, tensor.shape()).to(tensor.dtype());
  return fill_in_place("dirac_", tensor, [&](Tensor& t) { copy_into(t, source); });
}

const Tensor& kaiming_uniform_(const Tensor& tensor, double a, const std::string& mode,
                               const std::string& nonlinearity, Generator* gen) {
  const double bound = std::sqrt(3.0) * kaiming_std(tensor, a, mode, nonlinearity);
  return uniform_(tensor, -bound, bound, gen);
}

const Tensor& kaiming_normal_(const Tensor& tensor, double a, const std::string& mode,
                              const std::string& nonlinearity, Generator* gen) {
  return normal_(tensor, 0.0, kaiming_std(tensor, a, mode, nonlinearity), gen);
}

const Tensor& xavier_uniform_(const Tensor& tensor, double gain, Generator* gen) {
  const double bound = std::sqrt(3.0) * xavier_std(tensor, gain);
  return uniform_(tensor, -bound, bound, gen);
}

const Tensor& xavier_normal_(const Tensor& tensor, double gain, Generator* gen) {
  return normal_(tensor, 0.0, xavier_std(tensor, gain), gen);
}

void default_layer_init_(const Tensor& weight, const Tensor& bias) {
  kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = calculate_fan_in_and_fan_out(weight).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    uniform_(bias, -bound, bound);
  }
}

}  // namespace loom::nn::init
