// Note [Autocast precision by measurement] (conv_precision.h): the measurement.
#include "autograd/ops/conv_precision.h"

#include <omp.h>

#include <string>
#include <vector>

#include "autograd/autocast.h"           // defines: autocast::target_dtype, CastPolicy
#include "autograd/grad_mode.h"          // defines: GradMode, NoGradGuard
#include "autograd/ops/common.h"         // defines: activation_format
#include "core/cpu/kernel_benchmark.h"   // defines: backends::cpu::benchmark, autotune::choose
#include "core/error.h"                  // defines: detail::str
#include "core/factory.h"                // defines: empty

namespace loom::ops {
namespace {

// One training (or evaluation) use of the layer in `dtype`, with the casts it implies:
// the input's and parameters' to `dtype`, and, since the layer's output is autocast's
// `low` either way, the output's to `low` and its gradient's back. Gradient values do not
// change a kernel's time, so the forward's output stands in for the output gradient.
void run_layer_in(DType dtype, DType low, const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Conv2dParams& params, const Shape& out_shape, bool need_input_grad, bool need_weight_grad,
                  bool need_bias_grad) {
  NoGradGuard no_grad;
  const MemoryFormat format = activation_format(input);
  const Tensor x = input.detach().to(dtype).contiguous(format);
  const Tensor w = weight.detach().to(dtype).contiguous();
  const Tensor b = bias.defined() ? bias.detach().to(dtype).contiguous() : Tensor();
  Tensor y = empty(out_shape, TensorOptions(dtype).device(input.device()), format);
  conv2d_forward_kernel(input.device())(x, w, b, params, y);
  if (dtype != low) (void)y.to(low);  // the output cast
  if (!need_input_grad && !need_weight_grad && !need_bias_grad) return;
  if (dtype != low) (void)y.to(low).to(dtype);  // the output gradient, cast back (the output cast's backward)
  const TensorOptions float32 = TensorOptions(kFloat32).device(input.device());
  Tensor gx = need_input_grad ? empty_like(x, format) : Tensor();
  Tensor gw = need_weight_grad ? empty(weight.shape(), float32) : Tensor();
  Tensor gb = need_bias_grad ? empty({weight.size(0)}, float32) : Tensor();
  conv2d_backward_kernel(input.device())(y, x, w, params, gx, gw, gb);
  if (gx.defined() && dtype != input.dtype()) (void)gx.to(input.dtype());  // the input cast's backward
}

}  // namespace

bool autocast_conv2d_keeps_float32(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                   const Conv2dParams& params, const Shape& out_shape) {
  if (!input.device().is_cpu() || !backends::cpu::benchmark()) return false;
  const std::optional<DType> low = autocast::target_dtype(autocast::CastPolicy::LowerPrecision, DeviceType::CPU);
  if (!low) return false;
  // Only float32 parameters have a float32 to keep; float64 is never cast anyway.
  if (weight.dtype() != kFloat32 || (bias.defined() && bias.dtype() != kFloat32)) return false;
  if (input.dtype() != kFloat32 && input.dtype() != *low) return false;

  const bool grad = GradMode::is_enabled();
  const bool need_input_grad = grad && input.requires_grad();
  const bool need_weight_grad = grad && weight.requires_grad();
  const bool need_bias_grad = grad && bias.defined() && bias.requires_grad();
  const bool channels_last = activation_format(input) == MemoryFormat::ChannelsLast;
  const std::string what = detail::str("conv2d ", input.shape(), " (", input.dtype(), channels_last ? ", channels-last" : "",
                                       ") * ", weight.shape(), bias.defined() ? " + bias" : "", " stride ",
                                       params.stride[0], "x", params.stride[1], " padding ", params.padding[0], "x",
                                       params.padding[1], " dilation ", params.dilation[0], "x", params.dilation[1],
                                       " groups ", params.groups);
  const std::string key = detail::str("autocast ", *low, " ", what, " grads ", need_input_grad ? "x" : "-",
                                      need_weight_grad ? "w" : "-", need_bias_grad ? "b" : "-", " threads ",
                                      omp_get_max_threads());
  std::vector<cpu::autotune::Candidate> candidates;
  for (const DType dtype : {*low, kFloat32}) {
    candidates.push_back({detail::str(dtype),
                          [&, dtype] {
                            run_layer_in(dtype, *low, input, weight, bias, params, out_shape, need_input_grad,
                                         need_weight_grad, need_bias_grad);
                          },
                          // Either is within autocast's precision: each 16-bit pass was
                          // guarded by its own search (Note [Conv2d autotuning]), and
                          // float32 is more exact than asked.
                          [] { return 0.0; }});
  }
  const std::string chosen = cpu::autotune::choose(key, "autocast " + what, candidates, /*error_bound=*/0.0);
  if (chosen != detail::str(kFloat32)) return false;
  cpu::autotune::tell_once(key, "loom: autocast keeps " + what + " in float32: on this CPU it measured faster in "
                                "float32 than in " + detail::str(*low) + ", casts included (Note [Autocast precision "
                                "by measurement]).");
  return true;
}

}  // namespace loom::ops
