// Reductions: sum, mean, var, max/min (all or along a dim), argmax.
// Backward of a reduction broadcasts the output gradient back over the reduced dims.
#include <algorithm>

#include "autograd/autocast.h"  // defines: autocast::apply (Note [Autocast at op entry])
#include "autograd/ops.h"
#include "autograd/ops/common.h"

namespace loom {
namespace {

using Grads = std::vector<Tensor>;

// Wraps, sorts and de-duplicates dims; an empty list means "all dims" (as torch.sum(x, [])).
std::vector<int64_t> normalize_dims(const Tensor& x, const Shape& dims) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) {
    const int64_t wrapped = wrap_dim_or_scalar(d, x.dim());
    if (x.dim() > 0) out.push_back(wrapped);  // a scalar's dim 0 reduces nothing
  }
  std::sort(out.begin(), out.end());
  LOOM_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), "reduction: a dim appears more than once in ",
             dims);
  return out;
}

Shape keepdim_shape(const Tensor& x, const std::vector<int64_t>& dims) {
  Shape shape = x.shape();
  for (int64_t d : dims) shape[static_cast<size_t>(d)] = 1;
  return shape;
}

Shape dropped_shape(const Tensor& x, const std::vector<int64_t>& dims) {
  Shape shape;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d)) shape.push_back(x.size(d));
  return shape;
}

int64_t reduced_count(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t count = 1;
  for (int64_t d : dims) count *= x.size(d);
  return count;
}

// Runs reduce_kernel into a keepdim-shaped result, then views it without the dims.
Tensor reduce_forward(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  Tensor out = empty(keepdim_shape(x, dims), TensorOptions(x.dtype()).device(x.device()));
  if (x.dim() == 0) {  // nothing to reduce: the value itself
    out = x.detach().clone();
  } else {
    reduce_kernel(x.device())(op, x, dims, out);
  }
  return keepdim ? out : out.view(dropped_shape(x, dims));
}

// Gradient of a reduction: reshape the output gradient to keepdim shape, then expand.
Tensor expand_back(const Tensor& grad, const Shape& keep_shape, const Shape& input_shape) {
  return grad.reshape(keep_shape).expand(input_shape);
}

Tensor sum_or_mean(ReduceOp op, const char* name, const Tensor& x, const Shape& dims_in, bool keepdim) {
  ops::check_defined(name, x, "input");
  auto dims = normalize_dims(x, dims_in);
  Tensor out = reduce_forward(op, x, dims, keepdim);
  if (any_requires_grad({x})) {
    double scale = op == ReduceOp::Mean ? 1.0 / static_cast<double>(std::max<int64_t>(reduced_count(x, dims), 1)) : 1.0;
    record(op == ReduceOp::Mean ? "MeanBackward" : "SumBackward", {x}, {out},
           [keep = keepdim_shape(x, dims), in_shape = x.shape(), scale](const Grads& g) {
             Tensor grad = scale == 1.0 ? g[0] : g[0] * scale;
             return Grads{expand_back(grad, keep, in_shape)};
           });
  }
  return out;
}

// max()/min() over everything: the gradient is shared evenly among tied extremes.
Tensor extreme_all(bool is_max, const Tensor& x) {
  const char* name = is_max ? "max" : "min";
  ops::check_defined(name, x, "input");
  LOOM_CHECK(x.numel() > 0, name, "(): expected a non-empty tensor; the ", name, " of nothing is undefined");
  auto dims = normalize_dims(x, {});
  Tensor out = reduce_forward(is_max ? ReduceOp::Max : ReduceOp::Min, x, dims, false);
  if (any_requires_grad({x})) {
    record(is_max ? "MaxBackward" : "MinBackward", {x}, {out},
           [x_ = SavedTensor(x, name), y_ = SavedTensor(out, name)](const Grads& g) {
             // The elements equal to the result; if it is NaN, the NaNs (which equal nothing).
             const Tensor& xv = x_.get();
             Tensor mask = eq(xv, y_.get()).to(g[0].dtype()) +
                           ne(xv, xv).to(g[0].dtype()) * ne(y_.get(), y_.get()).to(g[0].dtype());
             return Grads{mask * (g[0] / sum(mask))};
           });
  }
  return out;
}

std::pair<Tensor, Tensor> extreme_dim(bool is_max, const Tensor& x, int64_t dim, bool keepdim) {
  const char* name = is_max ? "max" : "min";
  ops::check_defined(name, x, "input");
  dim = wrap_dim_or_scalar(dim, x.dim());
  std::vector<int64_t> dims = {dim};
  Shape keep = x.dim() == 0 ? Shape{} : keepdim_shape(x, dims);
  Tensor values = empty(keep, TensorOptions(x.dtype()).device(x.device()));
  Tensor indices = empty(keep, TensorOptions(kInt64).device(x.device()));
  if (x.dim() == 0) {
    values = x.detach().clone();
    indices.fill_(0);
  } else {
    max_min_dim_kernel(x.device())(is_max, x, dim, values, indices);
  }
  if (!keepdim && x.dim() > 0) {
    values = values.squeeze(dim);
    indices = indices.squeeze(dim);
  }
  if (any_requires_grad({x})) {
    // The gradient lands where the index points: compare an iota along `dim` with the
    // (keepdim) indices to build a one-hot mask.
    record(is_max ? "MaxDimBackward" : "MinDimBackward", {x}, {values},
           [idx = SavedTensor(indices, name), keep, in_shape = x.shape(), dim](const Grads& g) {
             if (in_shape.empty()) return Grads{g[0]};
             Shape iota_shape(in_shape.size(), 1);
             iota_shape[static_cast<size_t>(dim)] = in_shape[static_cast<size_t>(dim)];
             Tensor iota = arange(in_shape[static_cast<size_t>(dim)], TensorOptions(kInt64).device(g[0].device()))
                               .reshape(iota_shape);
             Tensor hit = eq(iota.expand(in_shape), idx.get().reshape(keep).expand(in_shape));
             Tensor grad = g[0].reshape(keep).expand(in_shape);
             return Grads{where(hit, grad, zeros_like(grad.contiguous()))};
           });
  }
  return {values, indices};
}

}  // namespace

Tensor sum(const Tensor& x) { return sum(x, {}, false); }
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = x;
    if (autocast::apply("sum", {&cx})) return sum(cx, dims, keepdim);
  }
  // As PyTorch: integers and bools sum in int64 (300 ones of uint8 are 300, not 44).
  if (x.defined() && !is_floating(x.dtype()) && x.dtype() != kInt64)
    return sum_or_mean(ReduceOp::Sum, "sum", x.to(kInt64), dims, keepdim);
  return sum_or_mean(ReduceOp::Sum, "sum", x, dims, keepdim);
}
Tensor mean(const Tensor& x) { return mean(x, {}, false); }
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = x;
    if (autocast::apply("mean", {&cx})) return mean(cx, dims, keepdim);
  }
  ops::check_floating("mean", x);
  return sum_or_mean(ReduceOp::Mean, "mean", x, dims, keepdim);
}

Tensor var(const Tensor& x, const Shape& dims_in, bool unbiased, bool keepdim) {
  if (autocast::any_enabled()) {  // See Note [Autocast at op entry]
    Tensor cx = x;
    if (autocast::apply("var", {&cx})) return var(cx, dims_in, unbiased, keepdim);
  }
  ops::check_floating("var", x);
  auto dims = normalize_dims(x, dims_in);
  Shape dims_shape(dims.begin(), dims.end());
  const int64_t count = reduced_count(x, dims);
  // Composed from differentiable ops, so its gradient needs no formula of its own.
  Tensor centered = x - mean(x, dims_shape, /*keepdim=*/true);
  const double denominator = static_cast<double>(count - (unbiased ? 1 : 0));
  return sum(centered * centered, dims_shape, keepdim) / denominator;
}

Tensor max(const Tensor& x) { return extreme_all(true, x); }
Tensor min(const Tensor& x) { return extreme_all(false, x); }
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim(true, x, dim, keepdim); }
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) { return extreme_dim(false, x, dim, keepdim); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return extreme_dim(true, x, dim, keepdim).second;
}

}  // namespace loom
