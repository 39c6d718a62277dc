// Neural-network functions (torch.nn.functional) other than conv2d: pooling,
// batch_norm, log_softmax/softmax, nll_loss/cross_entropy and dropout. Each validates
// its arguments with the messages users see, runs the backend kernel (core/kernels.h)
// and records its gradient right beside the forward.
//
// Semantics are PyTorch's, including the corner cases: pooling output sizes with
// ceil_mode, batch_norm's biased/unbiased variances and momentum, nll_loss's weighted
// mean, cross_entropy's label smoothing (as in PyTorch 1.13), dropout's 1/(1-p) scaling.
#include <array>
#include <cmath>
#include <initializer_list>

#include "autograd/autocast.h"  // defines: autocast::apply (Note [Autocast at op entry])
#include "autograd/ops.h"
#include "autograd/ops/common.h"

namespace loom {
namespace {

using Grads = std::vector<Tensor>;

TensorOptions options_of(const Tensor& t) { return TensorOptions(t.dtype()).device(t.device()); }

// ---- pooling ------------------------------------------------------------------------------

// PyTorch takes one value for both spatial dims or one per dim.
std::array<int64_t, 2> pair_arg(const char* op, const char* what, const std::vector<int64_t>& v) {
  LOOM_CHECK(v.size() == 1 || v.size() == 2, op, ": expected ", what, " to be a single int or a pair (H, W), got ",
             v.size(), " values");
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

void check_pool_input(const char* op, const Tensor& input) {
  ops::check_defined(op, input, "input");
  ops::check_floating(op, input);
  LOOM_CHECK(input.dim() == 3 || input.dim() == 4, op, ": expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got ",
             input.dim(), "-D input of shape ", input.shape());
  for (int64_t d = 1; d < input.dim(); ++d)
    LOOM_CHECK(input.size(d) > 0, op, ": expected non-empty C, H and W dims, got input of shape ", input.shape());
}

// The number of windows along one dim, by PyTorch's formula (pooling_output_shape):
// floor (or ceil) of (size + 2*pad - dilation*(kernel-1) - 1) / stride + 1, where in
// ceil mode the last window must still start inside the input or its left padding.
int64_t pooled_size(int64_t size, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  // In 128 bits: a huge kernel, padding or dilation must not wrap around into a plausible size.
  using Wide = __int128;
  const Wide span = Wide(size) + 2 * Wide(pad) - Wide(dilation) * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  Wide out = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;  // floor division
  if (ceil_mode && (out - 1) * stride >= Wide(size) + pad) --out;
  if (out < 0) return -1;  // no output: the caller says why
  return out > Wide(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(out);  // too large: the shape check says so
}

Pool2dParams pool_params(const char* op, const Tensor& input, const std::vector<int64_t>& kernel_size,
                         const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
                         const std::vector<int64_t>& dilation, bool ceil_mode, bool count_include_pad) {
  check_pool_input(op, input);
  Pool2dParams p;
  const auto k = pair_arg(op, "kernel_size", kernel_size);
  // An empty stride means stride = kernel_size, as in PyTorch.
  const auto s = stride.empty() ? k : pair_arg(op, "stride", stride);
  const auto pad = pair_arg(op, "padding", padding);
  const auto dil = pair_arg(op, "dilation", dilation);
  for (int d = 0; d < 2; ++d) {
    p.kernel[d] = k[d];
    p.stride[d] = s[d];
    p.padding[d] = pad[d];
    p.dilation[d] = dil[d];
  }
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  LOOM_CHECK(k[0] > 0 && k[1] > 0, op, ": kernel_size must be positive, got (", k[0], ", ", k[1], ")");
  LOOM_CHECK(s[0] > 0 && s[1] > 0, op, ": stride must be positive, got (", s[0], ", ", s[1], ")");
  LOOM_CHECK(dil[0] > 0 && dil[1] > 0, op, ": dilation must be positive, got (", dil[0], ", ", dil[1], ")");
  LOOM_CHECK(pad[0] >= 0 && pad[1] >= 0 && pad[0] <= k[0] / 2 && pad[1] <= k[1] / 2, op,
             ": padding must be between 0 and half the kernel size, got padding (", pad[0], ", ", pad[1],
             ") for kernel_size (", k[0], ", ", k[1], ")");
  return p;
}

Shape pooled_shape(const char* op, const Tensor& input, const Pool2dParams& p) {
  const int64_t h = input.size(-2), w = input.size(-1);
  const int64_t oh = pooled_size(h, p.kernel[0], p.padding[0], p.stride[0], p.dilation[0], p.ceil_mode);
  const int64_t ow = pooled_size(w, p.kernel[1], p.padding[1], p.stride[1], p.dilation[1], p.ceil_mode);
  LOOM_CHECK(oh >= 1 && ow >= 1, op, ": the pooling window (kernel (", p.kernel[0], ", ", p.kernel[1],
             ") with dilation (", p.dilation[0], ", ", p.dilation[1], ")) is larger than the padded input (",
             h + 2 * p.padding[0], " x ", w + 2 * p.padding[1], " for input of shape ", input.shape(),
             "), so the output would be ", oh, " x ", ow, "; use a smaller kernel or more padding");
  Shape shape = input.shape();
  shape[shape.size() - 2] = oh;
  shape[shape.size() - 1] = ow;
  return shape;
}

}  // namespace

Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, std::vector<int64_t> dilation, bool ceil_mode) {
  const Pool2dParams p = pool_params("max_pool2d", input, kernel_size, stride, padding, dilation, ceil_mode, true);
  const Shape shape = pooled_shape("max_pool2d", input, p);
  // A channels-last input keeps its layout (Note [Max pooling in channels-last], core/cpu/pooling.cpp),
  // as PyTorch's max_pool2d does; every other input gives an NCHW output.
  const bool channels_last = input.dim() == 4 && input.size(1) > 1 && input.device().is_cpu() &&
                             (input.dtype() == kFloat32 || input.dtype() == kFloat64) && !input.is_contiguous() &&
                             input.is_contiguous(MemoryFormat::ChannelsLast) && p.padding[0] == 0 &&
                             p.padding[1] == 0 && p.dilation[0] == 1 && p.dilation[1] == 1 &&
                             (shape[2] - 1) * p.stride[0] + p.kernel[0] <= input.size(2) &&
                             (shape[3] - 1) * p.stride[1] + p.kernel[1] <= input.size(3);
  const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  Tensor out = empty(shape, options_of(input), format);
  Tensor indices = empty(shape, TensorOptions(kInt64).device(input.device()), format);
  max_pool2d_forward_kernel(input.device())(input, p, out, indices);
  if (any_requires_grad({input})) {
    // The argmax indices are private to this node: nothing can modify them in place.
    record("MaxPool2DBackward", {input}, {out}, [indices, in_shape = input.shape(), format](const Grads& g) {
      Tensor grad_in = empty(in_shape, options_of(g[0]), format);
      max_pool2d_backward_kernel(g[0].device())(g[0], indices, grad_in);
      return Grads{grad_in};
    });
  }
  return out;
}

Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel_size, std::vector<int64_t> stride,
                  std::vector<int64_t> padding, bool ceil_mode, bool count_include_pad) {
  const Pool2dParams p =
      pool_params("avg_pool2d", input, kernel_size, stride, padding, {1, 1}, ceil_mode, count_include_pad);
  Tensor out = empty(pooled_shape("avg_pool2d", input, p), options_of(input));
  avg_pool2d_forward_kernel(input.device())(input, p, out);
  if (any_requires_grad({input})) {
    record("AvgPool2DBackward", {input}, {out}, [p, in_shape = input.shape()](const Grads& g) {
      Tensor grad_in = empty(in_shape, options_of(g[0]));
      avg_pool2d_backward_kernel(g[0].device())(g[0], p, grad_in);
      return Grads{grad_in};
    });
  }
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size) {
  check_pool_input("adaptive_avg_pool2d", input);
  const auto size = pair_arg("adaptive_avg_pool2d", "output_size", output_size);
  LOOM_CHECK(size[0] > 0 && size[1] > 0, "adaptive_avg_pool2d: expected a positive output_size, got (", size[0], ", ",
             size[1], ")");
  Shape shape = input.shape();
  shape[shape.size() - 2] = size[0];
  shape[shape.size() - 1] = size[1];
  Tensor out = empty(shape, options_of(input));
  adaptive_avg_pool2d_forward_kernel(input.device())(input, out);
  if (any_requires_grad({input})) {
    record("AdaptiveAvgPool2DBackward", {input}, {out}, [in_shape = input.shape()](const Grads& g) {
      Tensor grad_in = empty(in_shape, options_of(g[0]));
      adaptive_avg_pool2d_backward_kernel(g[0].device())(g[0], grad_in);
      return Grads{grad_in};
    });
  }
  return out;
}

// ---- batch normalisation ------------------------------------------------------------------

namespace {

// Note [Batch norm parameter dtype]
// Weight, bias and running statistics share one dtype: the input's, or float32 for a
// 16-bit input on the CPU (PyTorch's mixed-precision CPU batch norm, which CPU autocast
// relies on: Note [Mixed-precision batch norm on the CPU], core/cpu/batch_norm.cpp).
// The saved statistics and grad_weight / grad_bias take that dtype too; the output and
// grad_input take the input's. The CUDA kernels have no mixed variant (CUDA autocast
// runs batch norm in float32), so there the input's dtype is the only one accepted.
DType parameter_dtype(const Tensor& input, std::initializer_list<const Tensor*> params) {
  const bool mixed_ok = input.device().is_cpu() && (input.dtype() == kBFloat16 || input.dtype() == kFloat16);
  for (const Tensor* t : params)
    if (t->defined()) return mixed_ok && t->dtype() == kFloat32 ? kFloat32 : input.dtype();
  return mixed_ok ? kFloat32 : input.dtype();  // no parameters: statistics in float32 all the same
}

// A per-channel tensor (weight, bias, running stats) must be [C], like the input, of
// dtype `dtype` (Note [Batch norm parameter dtype]).
void check_per_channel(const Tensor& input, const Tensor& t, const char* what, DType dtype) {
  if (!t.defined()) return;
  const int64_t channels = input.size(1);
  LOOM_CHECK(t.dim() == 1 && t.size(0) == channels, "batch_norm: expected ", what, " of shape [", channels,
             "] (one value per channel of input ", input.shape(), "), got ", t.shape());
  const bool mixed = dtype != input.dtype();
  LOOM_CHECK(t.dtype() == dtype && t.device() == input.device(), "batch_norm: expected ", what, " of dtype ", dtype,
             " on ", input.device(), mixed ? " (a 16-bit input's float32 parameters: all of them float32)" : " (the input's)",
             ", got ", t.dtype(), " on ", t.device(),
             input.dtype() != kFloat32 && t.dtype() == kFloat32 && !input.device().is_cpu()
                 ? "; float32 parameters with 16-bit input work on the CPU only: on CUDA, run batch norm in float32 "
                   "(autocast does)"
                 : "");
  LOOM_CHECK(t.is_contiguous(), "batch_norm: expected a contiguous ", what, ", got strides ", t.strides());
}

// batch_norm(input, ...) + residual (if defined), then relu if `relu`: both public ops.
Tensor batch_norm_fused(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                        const Tensor& residual, bool relu) {
  ops::check_defined("batch_norm", input, "input");
  ops::check_floating("batch_norm", input);
  LOOM_CHECK(input.dim() >= 2, "batch_norm: expected an input of shape [N, C, ...] (at least 2-D), got ",
             input.shape());
  const DType param_dtype = parameter_dtype(input, {&weight, &bias, &running_mean, &running_var});
  check_per_channel(input, running_mean, "running_mean", param_dtype);
  check_per_channel(input, running_var, "running_var", param_dtype);
  check_per_channel(input, weight, "weight", param_dtype);
  check_per_channel(input, bias, "bias", param_dtype);
  LOOM_CHECK(running_mean.defined() == running_var.defined(),
             "batch_norm: running_mean and running_var must both be given or both be undefined");
  LOOM_CHECK(eps > 0, "batch_norm: expected eps > 0, got ", eps);
  if (residual.defined()) {
    ops::check_same_device_dtype("batch_norm_relu (residual)", input, residual);
    LOOM_CHECK(residual.shape() == input.shape(), "batch_norm_relu: expected a residual of the input's shape ",
               input.shape(), ", got ", residual.shape());
  }
  // Without running statistics there is nothing to evaluate with: batch statistics are
  // used in both modes, as nn.BatchNorm2d(track_running_stats=False) does.
  const bool batch_stats = training || !running_mean.defined();
  const int64_t channels = input.size(1);
  if (batch_stats) {
    LOOM_CHECK(input.numel() / std::max<int64_t>(channels, 1) > 1,
               "batch_norm: expected more than 1 value per channel when training, got input of shape ",
               input.shape(), "; use a batch of at least 2 samples or eval mode");
  }
  // The running buffers are updated in place and are never part of the graph.
  Tensor rm = running_mean, rv = running_var;
  if (training && rm.defined()) {
    LOOM_CHECK(!rm.requires_grad() && !rv.requires_grad(),
               "batch_norm: running_mean and running_var are updated in place in training and must not require "
               "grad; register them as buffers, not parameters");
  }
  Tensor out = empty(input.shape(), options_of(input), ops::activation_format(input));
  Tensor save_mean = empty({channels}, TensorOptions(param_dtype).device(input.device()));
  Tensor save_invstd = empty({channels}, TensorOptions(param_dtype).device(input.device()));
  batch_norm_forward_kernel(input.device())(input, weight, bias, rm, rv, batch_stats, momentum, eps, residual, relu,
                                            out, save_mean, save_invstd);
  if (training && rm.defined()) {
    rm.bump_version();  // See Note [Version counter]: anything that saved the old stats sees the change
    rv.bump_version();
  }
  if (!any_requires_grad({input, weight, bias, residual})) return out;
  const bool rx = input.requires_grad(), rw = weight.defined() && weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad(), rr = residual.defined() && residual.requires_grad();
  if (!relu && !residual.defined()) {
    record("BatchNormBackward", {input, weight, bias}, {out},
           [x_ = SavedTensor(input, "BatchNormBackward"), w_ = SavedTensor(weight, "BatchNormBackward"), save_mean,
            save_invstd, batch_stats, rx, rw, rb](const Grads& g) {
             const Tensor& x = x_.get();
             Tensor grad_in = rx ? empty(x.shape(), options_of(x), ops::activation_format(x)) : Tensor();
             Tensor grad_weight = rw ? empty(save_mean.shape(), options_of(save_mean)) : Tensor();
             Tensor grad_bias = rb ? empty(save_mean.shape(), options_of(save_mean)) : Tensor();
             Tensor no_grad_residual;
             batch_norm_backward_kernel(x.device())(g[0], x, w_.get(), save_mean, save_invstd, batch_stats, Tensor(),
                                                    grad_in, grad_weight, grad_bias, no_grad_residual);
             return Grads{grad_in, grad_weight, grad_bias};
           });
    return out;
  }
  // See Note [Fused BatchNorm epilogue]. Without the ReLU the residual's gradient is the
  // incoming one itself; with it, the kernel writes the masked gradient.
  const char* name = relu ? "BatchNormReluBackward" : "BatchNormAddBackward";
  record(name, {input, weight, bias, residual}, {out},
         [x_ = SavedTensor(input, name), w_ = SavedTensor(weight, name),
          y_ = SavedTensor(relu ? out : Tensor(), name), save_mean, save_invstd, batch_stats, rx, rw, rb,
          rr](const Grads& g) {
           const Tensor& x = x_.get();
           Tensor grad_in = rx ? empty(x.shape(), options_of(x), ops::activation_format(x)) : Tensor();
           Tensor grad_weight = rw ? empty(save_mean.shape(), options_of(save_mean)) : Tensor();
           Tensor grad_bias = rb ? empty(save_mean.shape(), options_of(save_mean)) : Tensor();
           Tensor grad_residual = rr && y_.defined() ? empty(x.shape(), options_of(x), ops::activation_format(x)) : Tensor();
           batch_norm_backward_kernel(x.device())(g[0], x, w_.get(), save_mean, save_invstd, batch_stats, y_.get(),
                                                  grad_in, grad_weight, grad_bias, grad_residual);
           if (rr && !y_.defined()) grad_residual = g[0];
           return Grads{grad_in, grad_weight, grad_bias, grad_residual};
         });
  return out;
}

}  // namespace

// Note [Fused BatchNorm epilogue]
// In a ResNet every BatchNorm is followed by a ReLU, directly (relu(bn(x))) or after the
// residual add (relu(bn(x) + shortcut)). As separate ops each is one more pass over a
// large activation and one more buffer: the add reads two tensors and writes one, the
// ReLU reads one and writes one, and in backward threshold_backward reads two and writes
// one. batch_norm_relu folds them into the BatchNorm kernel's passes, as cuDNN's
// BN_ADD_ACTIVATION mode does: the forward writes relu(bn(x) + residual) straight from
// the normalisation pass, and the backward reads the incoming gradient through ReLU's
// mask (out > 0) instead of materialising it, except as the residual's own gradient.
// The arithmetic is the composition's, operation for operation, so results are the same
// to the last bit. What backward saves is what the two ops would: x (BatchNorm's) and the
// output (ReLU's, which the next convolution saves anyway).
Tensor batch_norm_relu(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                       const Tensor& residual) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]; running stats stay as they are (updated in place)
    Tensor cx = input, cw = weight, cb = bias, cr = residual;
    if (autocast::apply("batch_norm_relu", {&cx, &cw, &cb, &cr}))
      return batch_norm_relu(cx, running_mean, running_var, cw, cb, training, momentum, eps, cr);
  }
  return batch_norm_fused(input, running_mean, running_var, weight, bias, training, momentum, eps, residual,
                          /*relu=*/true);
}

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]; running stats stay as they are (updated in place)
    Tensor cx = input, cw = weight, cb = bias;
    if (autocast::apply("batch_norm", {&cx, &cw, &cb}))
      return batch_norm(cx, running_mean, running_var, cw, cb, training, momentum, eps);
  }
  return batch_norm_fused(input, running_mean, running_var, weight, bias, training, momentum, eps, Tensor(),
                          /*relu=*/false);
}

// ---- softmax ------------------------------------------------------------------------------

Tensor log_softmax(const Tensor& input, int64_t dim) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = input;
    if (autocast::apply("log_softmax", {&cx})) return log_softmax(cx, dim);
  }
  ops::check_defined("log_softmax", input, "input");
  ops::check_floating("log_softmax", input);
  // A 0-d tensor is one row of one class (dim 0 or -1), as in PyTorch.
  const int64_t d = wrap_dim_or_scalar(dim, input.dim());
  if (input.numel() == 0) return input.clone();  // nothing to normalise: an empty result, as PyTorch
  const int64_t last = std::max<int64_t>(input.dim() - 1, 0);
  // The kernel works along the last dim of a dense tensor; move `dim` there if needed.
  const bool moved = d != last;
  Tensor rows = moved ? input.detach().transpose(d, last).contiguous() : input.detach();
  Tensor y = empty(rows.shape(), options_of(input));
  log_softmax_forward_kernel(input.device())(rows, y);
  Tensor out = moved ? y.transpose(d, last).contiguous() : y;
  if (any_requires_grad({input})) {
    record("LogSoftmaxBackward", {input}, {out},
           [y_ = SavedTensor(y, "LogSoftmaxBackward"), d, last, moved](const Grads& g) {
             Tensor grad_rows = moved ? g[0].transpose(d, last).contiguous() : g[0];
             Tensor grad_in = empty(grad_rows.shape(), options_of(grad_rows));
             log_softmax_backward_kernel(grad_rows.device())(grad_rows, y_.get(), grad_in);
             return Grads{moved ? grad_in.transpose(d, last).contiguous() : grad_in};
           });
  }
  return out;
}

// softmax = exp(log_softmax): stable, and its gradient composes from the two nodes.
Tensor softmax(const Tensor& input, int64_t dim) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = input;
    if (autocast::apply("softmax", {&cx})) return softmax(cx, dim);
  }
  ops::check_defined("softmax", input, "input");
  ops::check_floating("softmax", input);
  return exp(log_softmax(input, dim));
}

// ---- losses -------------------------------------------------------------------------------

namespace {

struct NllResult {
  Tensor loss;
  Tensor total_weight;  // [] : the sum of weight[target] over non-ignored targets
};

// nll_loss on [N, C] / [N] (the public op adds the single-sample [C] / [] form).
NllResult nll_loss_2d(const Tensor& log_probs, const Tensor& target, const Tensor& weight, Reduction reduction,
                      int64_t ignore_index) {
  const int64_t n = log_probs.size(0);
  Tensor out = empty(reduction == Reduction::None ? Shape{n} : Shape{}, options_of(log_probs));
  Tensor total_weight = empty({}, options_of(log_probs));
  nll_loss_forward_kernel(log_probs.device())(log_probs, target, weight, reduction, ignore_index, out, total_weight);
  if (any_requires_grad({log_probs})) {
    record("NllLossBackward", {log_probs}, {out},
           [target_ = SavedTensor(target, "NllLossBackward"), weight_ = SavedTensor(weight, "NllLossBackward"),
            total_weight, reduction, ignore_index, shape = log_probs.shape()](const Grads& g) {
             Tensor grad_in = empty(shape, options_of(g[0]));
             nll_loss_backward_kernel(g[0].device())(g[0], target_.get(), weight_.get(), reduction, ignore_index,
                                                     total_weight, grad_in);
             return Grads{grad_in};
           });
  }
  return {out, total_weight};
}

// Checks shapes and dtypes, then runs nll_loss_2d on the [N, C] form of the input.
NllResult nll_loss_checked(const char* op, const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                           Reduction reduction, int64_t ignore_index) {
  LOOM_CHECK(reduction == Reduction::None || reduction == Reduction::Mean || reduction == Reduction::Sum, op,
             ": reduction must be None, Mean or Sum, got the value ", static_cast<int>(reduction));
  ops::check_defined(op, log_probs, "input");
  ops::check_defined(op, target, "target");
  ops::check_floating(op, log_probs);
  LOOM_CHECK(log_probs.dim() == 1 || log_probs.dim() == 2, op,
             ": expected input of shape [N, C] (or [C] for one sample), got ", log_probs.shape());
  LOOM_CHECK(target.dtype() == kInt64, op, ": expected target of dtype int64 (class indices), got ", target.dtype(),
             "; convert with .to(kInt64)");
  LOOM_CHECK(target.device() == log_probs.device(), op, ": expected target on the input's device ",
             log_probs.device(), ", got ", target.device());
  const bool batched = log_probs.dim() == 2;
  const Shape expected_target = batched ? Shape{log_probs.size(0)} : Shape{};
  LOOM_CHECK(target.shape() == expected_target, op, ": expected target of shape ", expected_target,
             " (one class index per row of input ", log_probs.shape(), "), got ", target.shape());
  const int64_t classes = log_probs.size(-1);
  if (weight.defined()) {
    LOOM_CHECK(weight.dim() == 1 && weight.size(0) == classes, op, ": expected weight of shape [", classes,
               "] (one per class), got ", weight.shape());
    LOOM_CHECK(weight.dtype() == log_probs.dtype() && weight.device() == log_probs.device(), op,
               ": expected weight with the input's dtype and device (", log_probs.dtype(), ", ", log_probs.device(),
               "), got ", weight.dtype(), ", ", weight.device());
  }
  if (batched) return nll_loss_2d(log_probs, target, weight, reduction, ignore_index);
  NllResult r = nll_loss_2d(log_probs.unsqueeze(0), target.reshape({1}), weight, reduction, ignore_index);
  if (reduction == Reduction::None) r.loss = r.loss.squeeze(0);
  return r;
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight, Reduction reduction,
                int64_t ignore_index) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = log_probs, cw = weight;
    if (autocast::apply("nll_loss", {&cx, &cw})) return nll_loss(cx, target, cw, reduction, ignore_index);
  }
  return nll_loss_checked("nll_loss", log_probs, target, weight, reduction, ignore_index).loss;
}

// Note [Label smoothing]
// With smoothing e over C classes the target distribution is (1 - e) * one_hot + e / C,
// so the loss is (1 - e) * nll + (e / C) * sum_c -w_c * log p_c. PyTorch (1.13 and
// later) reduces the smoothing term like the nll term: ignored targets contribute 0,
// and `mean` divides by the same denominator, the summed weight of non-ignored targets.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight, Reduction reduction,
                     int64_t ignore_index, double label_smoothing) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = input, cw = weight;
    if (autocast::apply("cross_entropy", {&cx, &cw}))
      return cross_entropy(cx, target, cw, reduction, ignore_index, label_smoothing);
  }
  ops::check_defined("cross_entropy", input, "input");
  ops::check_defined("cross_entropy", target, "target");
  LOOM_CHECK(!is_floating(target.dtype()), "cross_entropy: expected target of int64 class indices, got a ",
             target.dtype(), " tensor; class-probability targets are not supported");
  LOOM_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
             "cross_entropy: expected label_smoothing between 0.0 and 1.0, got ", label_smoothing);
  LOOM_CHECK(input.dim() == 1 || input.dim() == 2, "cross_entropy: expected input of shape [N, C] (or [C]), got ",
             input.shape());
  const int64_t class_dim = input.dim() - 1;
  Tensor log_probs = log_softmax(input, class_dim);
  NllResult nll = nll_loss_checked("cross_entropy", log_probs, target, weight, reduction, ignore_index);
  if (label_smoothing == 0) return nll.loss;

  Tensor weighted = log_probs;
  if (weight.defined()) weighted = input.dim() == 2 ? log_probs * weight.reshape({1, -1}) : log_probs * weight;
  Tensor smooth = -sum(weighted, {class_dim});
  // ignore_index as an int64 tensor, exactly (through a double, INT64_MAX would not fit).
  const Tensor ignored = from_vector<int64_t>({ignore_index}, Shape{}).to(target.device());
  smooth = smooth * ne(target, ignored).to(smooth.dtype());
  Tensor reduced = smooth;
  if (reduction == Reduction::Sum) reduced = sum(smooth);
  if (reduction == Reduction::Mean) reduced = sum(smooth) / nll.total_weight;
  const double classes = static_cast<double>(input.size(class_dim));
  return nll.loss * (1 - label_smoothing) + reduced * (label_smoothing / classes);
}

// ---- dropout ------------------------------------------------------------------------------

Tensor dropout(const Tensor& input, double p, bool training, Generator* gen) {
  ops::check_defined("dropout", input, "input");
  LOOM_CHECK(p >= 0 && p <= 1, "dropout: expected a probability p between 0 and 1, got ", p);
  // As PyTorch: nothing is dropped (and no randomness drawn) in eval, at p = 0 or when
  // there is nothing to drop; p = 1 drops everything.
  if (!training || p == 0 || input.numel() == 0) return input;
  ops::check_floating("dropout", input);
  if (p == 1) return input * 0.0;
  Tensor out = empty(input.shape(), options_of(input));
  Tensor mask = empty(input.shape(), options_of(input));
  dropout_kernel(input.device())(input, p, gen ? *gen : default_generator(), out, mask);
  if (any_requires_grad({input})) {
    // The mask is private to this node, so it needs no version check.
    record("DropoutBackward", {input}, {out}, [mask](const Grads& g) { return Grads{g[0] * mask}; });
  }
  return out;
}

}  // namespace loom
