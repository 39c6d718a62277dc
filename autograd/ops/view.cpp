// Views and movement: ops that re-describe memory (shape, strides, offset) without
// copying, plus contiguous/clone/to which do copy. Backward of a view maps the gradient
// back to the input's shape: reshape back, permute back, or scatter into zeros.
#include <algorithm>
#include <optional>

#include "autograd/ops.h"
#include "autograd/ops/common.h"
#include "core/copy.h"

namespace loom {
namespace {

using Grads = std::vector<Tensor>;

Tensor make_view(const Tensor& x, Shape shape, Shape strides, int64_t offset) {
  return make_tensor(x.storage(), std::move(shape), std::move(strides), offset, x.dtype());
}

// Replaces one -1 in `shape` by what makes numel match; errors name both shapes.
Shape infer_shape(const Shape& requested, int64_t total, const Tensor& x) {
  Shape shape = requested;
  int64_t known = 1;
  int64_t infer = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      LOOM_CHECK(infer < 0, "view/reshape: only one dimension can be inferred (-1), got ", requested);
      infer = static_cast<int64_t>(d);
    } else {
      LOOM_CHECK(shape[d] >= 0, "view/reshape: invalid size ", shape[d], " in ", requested);
      known *= shape[d];
    }
  }
  if (infer >= 0) {
    LOOM_CHECK(known != 0 && total % known == 0, "shape ", requested, " is invalid for input of shape ", x.shape(),
               " (", total, " elements)");
    shape[static_cast<size_t>(infer)] = total / known;
  }
  LOOM_CHECK(numel(shape) == total, "shape ", requested, " is invalid for input of shape ", x.shape(), " (", total,
             " elements vs ", numel(shape), ")");
  return shape;
}

// Strides that let `shape` view memory laid out as (old_shape, old_strides), or nothing
// if the new shape would need elements that are not evenly spaced (then reshape copies).
// Groups of old dims that are contiguous with each other can be re-split freely.
std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  Shape strides(shape.size());
  if (numel(old_shape) == 0 || old_shape.empty()) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    // At the start of a contiguous chunk of old dims, lay the new dims over it.
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

}  // namespace

Tensor view(const Tensor& x, const Shape& requested) {
  ops::check_defined("view", x, "input");
  Shape shape = infer_shape(requested, x.numel(), x);
  auto strides = view_strides(x.shape(), x.strides(), shape);
  LOOM_CHECK(strides.has_value(), "view size ", requested, " is not compatible with input of shape ", x.shape(),
             " and strides ", x.strides(), " (at least one dimension spans across two contiguous subspaces); use "
             "reshape() instead, which copies when it must");
  Tensor out = make_view(x, shape, *strides, x.storage_offset());
  if (any_requires_grad({x}))
    record("ViewBackward", {x}, {out}, [s = x.shape()](const Grads& g) { return Grads{g[0].reshape(s)}; });
  return out;
}

Tensor reshape(const Tensor& x, const Shape& requested) {
  ops::check_defined("reshape", x, "input");
  Shape shape = infer_shape(requested, x.numel(), x);
  if (view_strides(x.shape(), x.strides(), shape)) return view(x, shape);
  return view(contiguous(x), shape);
}

Tensor permute(const Tensor& x, const Shape& dims) {
  LOOM_CHECK(static_cast<int64_t>(dims.size()) == x.dim(), "permute: expected ", x.dim(), " dims for a tensor of shape ",
             x.shape(), ", got ", dims);
  Shape shape(dims.size()), strides(dims.size()), inverse(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], x.dim());
    LOOM_CHECK(!seen[d], "permute: dimension ", d, " repeats in ", dims);
    seen[d] = true;
    shape[i] = x.size(d);
    strides[i] = x.stride(d);
    inverse[d] = static_cast<int64_t>(i);
  }
  Tensor out = make_view(x, shape, strides, x.storage_offset());
  if (any_requires_grad({x}))
    record("PermuteBackward", {x}, {out}, [inverse](const Grads& g) { return Grads{g[0].permute(inverse)}; });
  return out;
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  Shape dims(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) dims[d] = d;
  std::swap(dims[wrap_dim(dim0, x.dim())], dims[wrap_dim(dim1, x.dim())]);
  return permute(x, dims);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  dim = wrap_dim(dim, x.dim());
  LOOM_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t size = x.size(dim);
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape shape = x.shape(), strides = x.strides();
  shape[dim] = (end - start + step - 1) / step;
  strides[dim] *= step;
  Tensor out = make_view(x, shape, strides, x.storage_offset() + start * x.stride(dim));
  if (any_requires_grad({x})) {
    record("SliceBackward", {x}, {out}, [s = x.shape(), dim, start, end, step](const Grads& g) {
      Tensor grad = zeros(s, TensorOptions(g[0].dtype()).device(g[0].device()));
      Tensor window = slice(grad, dim, start, end, step);
      copy_into(window, g[0]);
      return Grads{grad};
    });
  }
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  dim = wrap_dim(dim, x.dim());
  LOOM_CHECK(length >= 0, "narrow: length must be non-negative, got ", length);
  if (start < 0) start += x.size(dim);
  LOOM_CHECK(start >= 0 && start <= x.size(dim) - length, "narrow: start (", start, ") + length (", length,
             ") exceeds dimension ", dim, " of size ", x.size(dim), " in shape ", x.shape());
  return slice(x, dim, start, start + length);
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  dim = wrap_dim(dim, x.dim());
  const int64_t size = x.size(dim);
  LOOM_CHECK(index >= -size && index < size, "select: index ", index, " is out of bounds for dimension ", dim,
             " with size ", size);
  if (index < 0) index += size;
  return squeeze(narrow(x, dim, index, 1), dim);
}

Tensor expand(const Tensor& x, const Shape& requested) {
  ops::check_defined("expand", x, "input");
  LOOM_CHECK(static_cast<int64_t>(requested.size()) >= x.dim(), "expand: the shape ", requested,
             " has fewer dimensions than the tensor's ", x.shape());
  const int64_t lead = static_cast<int64_t>(requested.size()) - x.dim();
  Shape shape(requested.size()), strides(requested.size());
  for (int64_t d = static_cast<int64_t>(requested.size()) - 1; d >= 0; --d) {
    int64_t want = requested[d];
    if (d < lead) {
      LOOM_CHECK(want >= 0, "expand: size -1 is not allowed in a new leading dimension, got ", requested);
      shape[d] = want;
      strides[d] = 0;
      continue;
    }
    int64_t have = x.size(d - lead);
    if (want == -1) want = have;
    LOOM_CHECK(have == want || have == 1, "expand: the expanded size ", want, " must match the existing size ", have,
               " at non-singleton dimension ", d, ". Target sizes: ", requested, ". Tensor sizes: ", x.shape());
    shape[d] = want;
    strides[d] = have == want ? x.stride(d - lead) : 0;
  }
  if (shape == x.shape()) return x;
  Tensor out = make_view(x, shape, strides, x.storage_offset());
  if (any_requires_grad({x}))
    record("ExpandBackward", {x}, {out}, [s = x.shape()](const Grads& g) { return Grads{sum_to(g[0], s)}; });
  return out;
}

Tensor squeeze(const Tensor& x) {
  Shape shape;
  for (int64_t size : x.shape())
    if (size != 1) shape.push_back(size);
  return reshape(x, shape);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim_or_scalar(dim, x.dim());
  if (x.dim() == 0) return x;  // as PyTorch: a scalar squeezed is itself
  if (x.size(dim) != 1) return x;
  Shape shape = x.shape(), strides = x.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  Tensor out = make_view(x, shape, strides, x.storage_offset());
  if (any_requires_grad({x}))
    record("SqueezeBackward", {x}, {out}, [s = x.shape()](const Grads& g) { return Grads{g[0].reshape(s)}; });
  return out;
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim() + 1);
  Shape shape = x.shape(), strides = x.strides();
  int64_t stride = dim < x.dim() ? x.stride(dim) * x.size(dim) : 1;
  shape.insert(shape.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  Tensor out = make_view(x, shape, strides, x.storage_offset());
  if (any_requires_grad({x}))
    record("UnsqueezeBackward", {x}, {out}, [s = x.shape()](const Grads& g) { return Grads{g[0].reshape(s)}; });
  return out;
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  start_dim = wrap_dim(start_dim, x.dim());
  end_dim = wrap_dim(end_dim, x.dim());
  LOOM_CHECK(start_dim <= end_dim, "flatten: start_dim (", start_dim, ") must not come after end_dim (", end_dim, ")");
  Shape shape(x.shape().begin(), x.shape().begin() + start_dim);
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged *= x.size(d);
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + end_dim + 1, x.shape().end());
  return reshape(x, shape);
}

namespace {
Tensor copy_as(const Tensor& x, MemoryFormat format) {
  Tensor out = empty_like(x, format);
  copy_into(out, x);
  if (any_requires_grad({x})) record("CloneBackward", {x}, {out}, [](const Grads& g) { return Grads{g[0]}; });
  return out;
}
}  // namespace

Tensor clone(const Tensor& x) {
  ops::check_defined("clone", x, "input");
  return copy_as(x, MemoryFormat::Preserve);
}

Tensor contiguous(const Tensor& x) { return contiguous(x, MemoryFormat::Contiguous); }

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  ops::check_defined("contiguous", x, "input");
  return x.is_contiguous(format) ? x : copy_as(x, format);
}

Tensor to(const Tensor& x, Device device, bool non_blocking) {
  ops::check_defined("to", x, "input");
  if (x.device() == device) return x;
  // memory_format=torch.preserve_format, PyTorch's default: a channels-last activation moved
  // to the next stage's device stays channels-last, so the layers there run the kernels one
  // device runs (an NCHW copy would take other kernels, other rounding, and two reorders).
  Tensor out = empty(x.shape(), TensorOptions(x.dtype()).device(device), x.suggest_memory_format());
  copy_into(out, x, non_blocking);
  if (any_requires_grad({x})) {
    record("ToDeviceBackward", {x}, {out}, [from = x.device()](const Grads& g) { return Grads{g[0].to(from)}; },
           /*saves_tensors=*/false);  // Note [Nodes that save nothing]
  }
  return out;
}

Tensor to(const Tensor& x, DType dtype) {
  ops::check_defined("to", x, "input");
  if (x.dtype() == dtype) return x;
  Tensor out = empty(x.shape(), TensorOptions(dtype).device(x.device()), x.suggest_memory_format());
  copy_into(out, x);
  if (any_requires_grad({x}) && is_floating(dtype)) {
    record("ToDTypeBackward", {x}, {out}, [from = x.dtype()](const Grads& g) { return Grads{g[0].to(from)}; },
           /*saves_tensors=*/false);  // Note [Nodes that save nothing]
  }
  return out;
}

}  // namespace loom
