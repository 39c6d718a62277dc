// Joining, splitting and indexing: cat, stack, split, split_with_sizes, chunk,
// index_select, gather — forward and gradient side by side.
//
// Note [Split returns views]
// split, split_with_sizes and chunk return narrow() views of their input: no copy. DP
// scatters a batch over devices and the pipeline cuts micro-batches this way, so cutting
// must cost nothing. Each piece is an independent narrow with its own backward (the
// piece's gradient placed into zeros of the input's shape), so one piece can be
// back-propagated while the others are not used, or are back-propagated later by another
// backward() call — what a pipeline schedule does with its micro-batches. The price:
// when all k pieces flow back in one backward, the input's gradient is the sum of k
// zero-padded tensors rather than one concatenation. Batches cut by split are usually
// data, which needs no gradient at all.
#include "autograd/ops.h"
#include "autograd/ops/common.h"
#include "core/copy.h"

namespace loom {
namespace {

using Grads = std::vector<Tensor>;

// The error for a tensor of a list that does not fit the first one.
void check_joinable(const char* op, const std::vector<Tensor>& tensors) {
  LOOM_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    LOOM_CHECK(tensors[i].defined(), op, ": tensor ", i, " is undefined");
    LOOM_CHECK(tensors[i].dtype() == tensors[0].dtype(), op, ": expected all tensors to have the same dtype, but ",
               "tensor ", i, " is ", tensors[i].dtype(), " and tensor 0 is ", tensors[0].dtype());
    LOOM_CHECK(tensors[i].device() == tensors[0].device(), op, ": expected all tensors on the same device, but tensor ",
               i, " is on ", tensors[i].device(), " and tensor 0 on ", tensors[0].device());
  }
}

void check_index_tensor(const char* op, const Tensor& x, const Tensor& index) {
  ops::check_defined(op, x, "the input");
  ops::check_defined(op, index, "the index");
  LOOM_CHECK(x.dim() >= 1, op, ": expected an input with at least 1 dimension, got a 0-dim tensor; unsqueeze it first");
  LOOM_CHECK(index.dtype() == kInt64, op, ": expected an int64 index, got ", index.dtype(),
             "; convert it with .to(kInt64)");
  LOOM_CHECK(index.device() == x.device(), op, ": the index is on ", index.device(), " but the input is on ",
             x.device());
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  check_joinable("cat", tensors);
  const Tensor& first = tensors[0];
  LOOM_CHECK(first.dim() >= 1, "cat: zero-dimensional tensor 0 cannot be concatenated; unsqueeze it or use stack");
  dim = wrap_dim(dim, first.dim());
  Shape shape = first.shape();
  shape[dim] = 0;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    bool fits = t.dim() == first.dim();
    for (int64_t d = 0; fits && d < t.dim(); ++d) fits = d == dim || t.size(d) == first.size(d);
    LOOM_CHECK(fits, "cat: sizes of tensors must match except in dimension ", dim, ", but tensor ", i, " has shape ",
               t.shape(), " and tensor 0 has shape ", first.shape());
    sizes.push_back(t.size(dim));
    shape[dim] += t.size(dim);
  }
  Tensor out = empty(shape, TensorOptions(first.dtype()).device(first.device()));
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor window = narrow(out, dim, offset, sizes[i]);
    copy_into(window, tensors[i]);
    offset += sizes[i];
  }
  if (any_requires_grad(tensors)) {
    // Each input's gradient is its window of the output's gradient: a view, no copy.
    record("CatBackward", tensors, {out}, [dim, sizes](const Grads& g) {
      Grads grads;
      int64_t start = 0;
      for (int64_t size : sizes) {
        grads.push_back(narrow(g[0], dim, start, size));
        start += size;
      }
      return grads;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  check_joinable("stack", tensors);
  for (size_t i = 1; i < tensors.size(); ++i) {
    LOOM_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: expects each tensor to be equal size, but got ",
               tensors[0].shape(), " at entry 0 and ", tensors[i].shape(), " at entry ", i);
  }
  dim = wrap_dim(dim, tensors[0].dim() + 1);
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (const Tensor& t : tensors) expanded.push_back(unsqueeze(t, dim));
  return cat(expanded, dim);
}

std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  ops::check_defined("split_with_sizes", x, "the input");
  LOOM_CHECK(x.dim() >= 1, "split: expected a tensor with at least 1 dimension, got a 0-dim tensor");
  dim = wrap_dim(dim, x.dim());
  int64_t total = 0;
  for (int64_t size : sizes) {
    LOOM_CHECK(size >= 0, "split_with_sizes: sizes must be non-negative, got ", Shape(sizes));
    total += size;
  }
  LOOM_CHECK(total == x.size(dim), "split_with_sizes: expected sizes to sum exactly to ", x.size(dim),
             " (the size of dimension ", dim, " of ", x.shape(), "), but got sizes ", Shape(sizes),
             " summing to ", total);
  // Note [Split returns views].
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t size : sizes) {
    pieces.push_back(narrow(x, dim, start, size));
    start += size;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  ops::check_defined("split", x, "the input");
  LOOM_CHECK(x.dim() >= 1, "split: expected a tensor with at least 1 dimension, got a 0-dim tensor");
  dim = wrap_dim(dim, x.dim());
  const int64_t size = x.size(dim);
  LOOM_CHECK(split_size > 0 || (split_size == 0 && size == 0), "split: split_size must be positive, got ",
             split_size, " for dimension ", dim, " of size ", size);
  if (size == 0) return {x};
  // Full pieces of split_size, then what is left (smaller) as the last.
  std::vector<int64_t> sizes((size - 1) / split_size + 1, split_size);  // ceil(size / split_size), no overflow
  sizes.back() = size - split_size * (static_cast<int64_t>(sizes.size()) - 1);
  return split_with_sizes(x, sizes, dim);
}

// As torch.chunk: pieces of ceil(size / chunks), so fewer than `chunks` pieces can come
// back (size 5 in 4 chunks is 2 + 2 + 1: three pieces). A dim of size 0 gives `chunks`
// empty pieces.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  ops::check_defined("chunk", x, "the input");
  LOOM_CHECK(chunks > 0, "chunk: expected a positive number of chunks, got ", chunks);
  LOOM_CHECK(x.dim() >= 1, "chunk: expected a tensor with at least 1 dimension, got a 0-dim tensor");
  dim = wrap_dim(dim, x.dim());
  const int64_t size = x.size(dim);
  if (size == 0) return split_with_sizes(x, std::vector<int64_t>(static_cast<size_t>(chunks), 0), dim);
  return split(x, (size - 1) / chunks + 1, dim);  // ceil(size / chunks), no overflow
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_tensor("index_select", x, index);
  LOOM_CHECK(index.dim() <= 1, "index_select: expected a 1-D index, got shape ", index.shape());
  dim = wrap_dim(dim, x.dim());
  Shape shape = x.shape();
  shape[dim] = index.numel();
  Tensor out = empty(shape, TensorOptions(x.dtype()).device(x.device()));
  index_select_kernel(x.device())(x, dim, index, out);
  if (any_requires_grad({x})) {
    // Each selected slice's gradient goes back to its source slice; a repeated index
    // collects the sum of its slices' gradients.
    record("IndexSelectBackward", {x}, {out},
           [index_ = SavedTensor(index, "IndexSelectBackward"), dim, shape_in = x.shape()](const Grads& g) {
             Tensor grad = zeros(shape_in, TensorOptions(g[0].dtype()).device(g[0].device()));
             index_add_kernel(grad.device())(grad, dim, index_.get(), g[0]);
             return Grads{grad};
           });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_index_tensor("gather", x, index);
  dim = wrap_dim(dim, x.dim());
  LOOM_CHECK(index.dim() == x.dim(), "gather: expected the index to have as many dims as the input (", x.dim(),
             "), got index ", index.shape(), " for input ", x.shape());
  for (int64_t d = 0; d < x.dim(); ++d) {
    LOOM_CHECK(d == dim || index.size(d) <= x.size(d), "gather: index ", index.shape(),
               " must be no larger than input ", x.shape(), " in every dimension except ", dim,
               ", but dimension ", d, " is ", index.size(d), " > ", x.size(d));
  }
  Tensor out = empty(index.shape(), TensorOptions(x.dtype()).device(x.device()));
  gather_kernel(x.device())(x, dim, index, out);
  if (any_requires_grad({x})) {
    record("GatherBackward", {x}, {out},
           [index_ = SavedTensor(index, "GatherBackward"), dim, shape_in = x.shape()](const Grads& g) {
             Tensor grad = zeros(shape_in, TensorOptions(g[0].dtype()).device(g[0].device()));
             scatter_add_kernel(grad.device())(grad, dim, index_.get(), g[0]);
             return Grads{grad};
           });
  }
  return out;
}

}  // namespace loom
