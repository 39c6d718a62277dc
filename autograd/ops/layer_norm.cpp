// layer_norm (torch.nn.functional.layer_norm): normalises over the trailing dims named by
// normalized_shape, with an optional elementwise affine transform; the gradient beside it.
#include "autograd/ops.h"                  // declares: layer_norm
#include "autograd/ops/common.h"           // defines: check_defined, check_floating, check_same_device_dtype, statistics_options
#include "core/kernels.h"                  // declares: layer_norm_forward_kernel, layer_norm_backward_kernel

namespace loom {
namespace {

using Grads = std::vector<Tensor>;

TensorOptions options_of(const Tensor& t) { return TensorOptions(t.dtype()).device(t.device()); }

void check_affine(const Tensor& input, const Tensor& t, const char* what, const Shape& normalized_shape) {
  if (!t.defined()) return;
  ops::check_same_device_dtype("layer_norm", input, t);
  LOOM_CHECK(t.shape() == normalized_shape, "layer_norm: expected ", what, " of shape ", normalized_shape,
             " (normalized_shape), got ", t.shape());
}

}  // namespace

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  ops::check_defined("layer_norm", input, "input");
  ops::check_floating("layer_norm", input);
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  LOOM_CHECK(nd >= 1, "layer_norm: expected normalized_shape to be at least 1-dimensional, i.e. containing at "
             "least one element, got ", normalized_shape);
  bool trailing = input.dim() >= nd;
  for (int64_t d = 0; trailing && d < nd; ++d) trailing = input.size(input.dim() - nd + d) == normalized_shape[d];
  LOOM_CHECK(trailing, "layer_norm: given normalized_shape=", normalized_shape, ", expected input with shape [*, ",
             Shape(normalized_shape), "] (those trailing dims), but got input of size ", input.shape());
  check_affine(input, weight, "weight", normalized_shape);
  check_affine(input, bias, "bias", normalized_shape);
  LOOM_CHECK(eps >= 0, "layer_norm: expected a non-negative eps, got ", eps);

  int64_t rows = 1, cols = 1;
  for (int64_t d = 0; d < input.dim(); ++d) (d < input.dim() - nd ? rows : cols) *= input.size(d);
  const Tensor x = input.detach().reshape({rows, cols});
  const Tensor w = weight.defined() ? weight.detach().reshape({cols}) : Tensor();
  const Tensor b = bias.defined() ? bias.detach().reshape({cols}) : Tensor();
  Tensor out = empty(input.shape(), options_of(input));
  Tensor out_rows = out.view({rows, cols});
  const TensorOptions statistics = ops::statistics_options(input);
  Tensor mean = empty({rows}, statistics), rstd = empty({rows}, statistics);
  layer_norm_forward_kernel(input.device())(x, w, b, eps, out_rows, mean, rstd);
  if (!any_requires_grad({input, weight, bias})) return out;
  const bool rx = input.requires_grad(), rw = weight.defined() && weight.requires_grad(),
             rb = bias.defined() && bias.requires_grad();
  // mean and rstd are private to this node; x and w are the caller's, so version-checked.
  record("NativeLayerNormBackward", {input, weight, bias}, {out},
         [x_ = SavedTensor(x, "NativeLayerNormBackward"), w_ = SavedTensor(w, "NativeLayerNormBackward"), mean,
          rstd, in_shape = input.shape(), w_shape = normalized_shape, rows, cols, rx, rw, rb](const Grads& g) {
           Tensor grad_x = rx ? empty({rows, cols}, options_of(g[0])) : Tensor();
           Tensor grad_w = rw ? empty({cols}, options_of(g[0])) : Tensor();
           Tensor grad_b = rb ? empty({cols}, options_of(g[0])) : Tensor();
           LOOM_CHECK(g[0].device() == mean.device(), "layer_norm backward: expected the gradient on the input's "
                      "device ", mean.device(), ", got ", g[0].device());
           layer_norm_backward_kernel(mean.device())(g[0].reshape({rows, cols}), x_.get(), w_.get(), mean, rstd,
                                                     grad_x, grad_w, grad_b);
           return Grads{rx ? grad_x.view(in_shape) : Tensor(), rw ? grad_w.view(w_shape) : Tensor(),
                        rb ? grad_b.view(w_shape) : Tensor()};
         });
  return out;
}

}  // namespace loom
