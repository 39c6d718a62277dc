// conv2d (torch.nn.functional.conv2d): validation, forward, and its gradient.
//
// The math lives in the device kernels (core/kernels.h: conv2d_forward_kernel,
// conv2d_backward_kernel); this file owns the contract users see: PyTorch's argument
// forms (an int or a pair for stride/padding/dilation), the shape rules with errors that
// say what was expected, and the backward node that asks the kernel for exactly the
// gradients the graph needs.
#include "autograd/autocast.h"  // defines: autocast::apply (Note [Autocast at op entry])
#include "autograd/ops.h"
#include "autograd/ops/common.h"
#include "autograd/ops/conv_precision.h"  // defines: autocast_conv2d_keeps_float32
#include "core/flop_counter.h"     // defines: FlopCounterMode (counted for balance_by_cost_model)

namespace loom {
namespace {

// PyTorch accepts `stride=2` or `stride=(2, 1)`; both arrive here as a vector.
void expand_pair(const char* name, const std::vector<int64_t>& values, int64_t min_value, int64_t out[2]) {
  LOOM_CHECK(values.size() == 1 || values.size() == 2, "conv2d: expected ", name,
             " to have 1 or 2 values (one for both spatial dims, or [height, width]), got ", values.size(),
             " values ", Shape(values));
  out[0] = values[0];
  out[1] = values.size() == 2 ? values[1] : values[0];
  LOOM_CHECK(out[0] >= min_value && out[1] >= min_value, "conv2d: expected every ", name, " value to be >= ",
             min_value, ", got ", Shape(values));
}

void check_shapes(const Tensor& input, const Tensor& weight, const Tensor& bias, int64_t groups) {
  LOOM_CHECK(input.dim() == 4, "conv2d: expected a 4-D input [N, C, H, W], got a ", input.dim(),
             "-D tensor of shape ", input.shape(),
             input.dim() == 3 ? "; for a single image add the batch dimension with input.unsqueeze(0)" : "");
  LOOM_CHECK(weight.dim() == 4, "conv2d: expected a 4-D weight [out_channels, in_channels / groups, kH, kW], got a ",
             weight.dim(), "-D tensor of shape ", weight.shape());
  LOOM_CHECK(groups >= 1, "conv2d: expected groups >= 1, got ", groups);
  LOOM_CHECK(weight.size(0) > 0 && weight.size(2) > 0 && weight.size(3) > 0, "conv2d: weight ", weight.shape(),
             " has no output channels or an empty kernel; expected [out_channels >= 1, in_channels / groups, "
             "kH >= 1, kW >= 1]");
  const int64_t channels = input.size(1), out_channels = weight.size(0);
  LOOM_CHECK(channels % groups == 0 && out_channels % groups == 0, "conv2d: input ", input.shape(), " has ",
             channels, " channels and weight ", weight.shape(), " has ", out_channels,
             " output channels; both must be divisible by groups = ", groups);
  LOOM_CHECK(weight.size(1) * groups == channels, "conv2d: weight ", weight.shape(), " expects ",
             weight.size(1) * groups, " input channels (weight.size(1) * groups = ", weight.size(1), " * ", groups,
             ") but input ", input.shape(), " has ", channels);
  if (bias.defined()) {
    LOOM_CHECK(bias.dim() == 1 && bias.size(0) == out_channels, "conv2d: expected bias of shape [", out_channels,
               "] (one per output channel of weight ", weight.shape(), "), got ", bias.shape());
  }
}

// Output extent along one axis; a loom::Error when the (dilated) kernel does not fit.
int64_t output_extent(const Tensor& input, const Tensor& weight, const Conv2dParams& p, int axis) {
  const int64_t in = input.size(2 + axis), kernel = weight.size(2 + axis);
  const int64_t span = p.dilation[axis] * (kernel - 1) + 1;
  const int64_t padded = in + 2 * p.padding[axis];
  LOOM_CHECK(padded >= span, "conv2d: input ", input.shape(), " padded to ", padded, " along ",
             axis == 0 ? "height" : "width", " is smaller than the kernel's extent ", span, " (weight ",
             weight.shape(), ", dilation ", p.dilation[axis], "), so the output would be empty; "
             "use more padding, a smaller kernel or dilation, or a larger input");
  return (padded - span) / p.stride[axis] + 1;
}

// Note [Autocast conv2d weight gradients]
// Under autocast the convolution runs on 16-bit casts of float32 parameters (the weight
// cast cache, autograd/autocast.h). Recorded plainly, its weight gradient would be
// rounded to 16 bits and then widened by the cast's backward: one bfloat16 rounding
// (2^-9 relative) of every parameter's gradient, every step, for nothing -- the kernels
// accumulate in float32 anyway. So when autocast cast a float32 weight (and bias), the
// Conv2dBackward node takes its gradient edges from the float32 tensors themselves and
// asks the kernel for float32 weight and bias gradients (core/kernels.h allows them for
// 16-bit inputs; oneDNN writes them directly, Note [Conv2d in bfloat16]). The engine
// sees a float32 gradient for a float32 input, as it checks; the cast's own node gets
// nothing from this convolution, and the gradient reaching the parameter is the sum
// over its uses as before. The input keeps its 16-bit edge: the activation gradient
// flows on through 16-bit ops.
struct GradTargets {
  Tensor weight, bias;  // the tensors the weight and bias gradients go to
};

// The parameters in kernel form and the output's shape; validated (shapes only: under
// autocast the dtypes are checked after the casts, in conv2d_impl).
struct Conv2dCall {
  Conv2dParams params;
  Shape out_shape;
};

Conv2dCall prepare(const Tensor& input, const Tensor& weight, const Tensor& bias, const std::vector<int64_t>& stride,
                   const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups) {
  check_shapes(input, weight, bias, groups);
  Conv2dCall call;
  call.params.groups = groups;
  expand_pair("stride", stride, 1, call.params.stride);
  expand_pair("padding", padding, 0, call.params.padding);
  expand_pair("dilation", dilation, 1, call.params.dilation);
  call.out_shape = {input.size(0), weight.size(0), output_extent(input, weight, call.params, 0),
                    output_extent(input, weight, call.params, 1)};
  return call;
}

Tensor conv2d_impl(const Tensor& input, const Tensor& weight, const Tensor& bias, const GradTargets& targets,
                   const Conv2dCall& call);

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, std::vector<int64_t> stride,
              std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups) {
  const Conv2dCall call = prepare(input, weight, bias, stride, padding, dilation, groups);
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    if (ops::autocast_conv2d_keeps_float32(input, weight, bias, call.params, call.out_shape)) {
      // Note [Autocast precision by measurement]: this layer computes in float32, as if
      // outside the scope; a 16-bit input (an earlier layer's) is widened first, and the
      // output is narrowed to autocast's dtype, as every conv2d under autocast returns
      // (the next op may add it to a 16-bit residual).
      const DType low = *autocast::target_dtype(autocast::CastPolicy::LowerPrecision, DeviceType::CPU);
      autocast::Guard float32(DeviceType::CPU, std::nullopt, /*enabled=*/false);
      const Tensor x = input.dtype() == kFloat32 ? input : input.to(kFloat32);
      return conv2d_impl(x, weight, bias, GradTargets{weight, bias}, call).to(low);
    }
    Tensor cx = input, cw = weight, cb = bias;
    if (autocast::apply("conv2d", {&cx, &cw, &cb})) {
      // See Note [Autocast conv2d weight gradients].
      const bool float32_grads = !cw.is_same(weight) && weight.dtype() == kFloat32 &&
                                 (!bias.defined() || (!cb.is_same(bias) && bias.dtype() == kFloat32));
      const GradTargets targets = float32_grads ? GradTargets{weight, bias} : GradTargets{cw, cb};
      return conv2d_impl(cx, cw, cb, targets, call);
    }
  }
  return conv2d_impl(input, weight, bias, GradTargets{weight, bias}, call);
}

namespace {

Tensor conv2d_impl(const Tensor& input, const Tensor& weight, const Tensor& bias, const GradTargets& targets,
                   const Conv2dCall& call) {
  ops::check_same_device_dtype("conv2d", input, weight);
  ops::check_floating("conv2d", input);
  if (bias.defined()) ops::check_same_device_dtype("conv2d (bias)", input, bias);
  const Conv2dParams& params = call.params;
  const Shape& out_shape = call.out_shape;

  // Kernels take dense activations, NCHW or (on the CPU) channels-last, which the output
  // and the input gradient then share (Note [Channels-last activations]), and OIHW
  // weights; detached so that making them dense records nothing.
  const MemoryFormat format = ops::activation_format(input);
  Tensor x = input.detach().contiguous(format);
  Tensor w = weight.detach().contiguous();
  Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor out = empty(out_shape, TensorOptions(input.dtype()).device(input.device()), format);
  conv2d_forward_kernel(input.device())(x, w, b, params, out);
  // Each output element is a dot product of (C_in / groups)·kh·kw pairs: a multiply and an add each.
  FlopCounterMode::add_flops(2 * out.numel() * w.size(1) * w.size(2) * w.size(3));

  if (any_requires_grad({input, targets.weight, targets.bias})) {
    // Both are saved whatever is needed, as PyTorch does: the kernel derives every size
    // from them, and in a network the input is usually kept alive by the previous op.
    record("Conv2dBackward", {input, targets.weight, targets.bias}, {out},
           [x_ = SavedTensor(x, "Conv2dBackward"), w_ = SavedTensor(w, "Conv2dBackward"), params, format,
            need_input = input.requires_grad(), need_weight = targets.weight.requires_grad(),
            need_bias = targets.bias.defined() && targets.bias.requires_grad(),
            grad_dtype = targets.weight.dtype()](const std::vector<Tensor>& grads) {
             const Tensor& xs = x_.get();
             const Tensor& ws = w_.get();
             // Gradients may arrive as broadcast views (the gradient of sum() is an expanded one).
             Tensor grad_out = grads[0].contiguous(format);
             Tensor grad_input = need_input ? empty_like(xs, format) : Tensor();
             // grad_dtype: float32 under Note [Autocast conv2d weight gradients], else ws's
             const TensorOptions grad_options = TensorOptions(grad_dtype).device(ws.device());
             Tensor grad_weight = need_weight ? empty(ws.shape(), grad_options) : Tensor();
             Tensor grad_bias = need_bias ? empty({ws.size(0)}, grad_options) : Tensor();
             conv2d_backward_kernel(xs.device())(grad_out, xs, ws, params, grad_input, grad_weight, grad_bias);
             return std::vector<Tensor>{grad_input, grad_weight, grad_bias};
           });
  }
  return out;
}

}  // namespace
}  // namespace loom
