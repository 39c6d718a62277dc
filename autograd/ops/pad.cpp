// flip and pad (torch.flip, torch.nn.functional.pad) as index maps over index_select.
//
// Note [Padding as an index map]
// Every non-constant padding mode picks, for each output position along a dim, one input
// position: reflect mirrors about the edge without repeating it (for width 4 and padding 2:
// 2 1 | 0 1 2 3 | 2 1), replicate repeats the edge (0 0 | 0 1 2 3 | 3 3), circular wraps
// (2 3 | 0 1 2 3 | 0 1). So pad is one index_select per padded dim with that map, and flip
// the map n-1 ... 0; both inherit index_select's gradient (the adjoint scatter-add, which
// sums the gradients of a position read twice) and its kernels on every device. The copies
// cost one pass over the output per dim, which is nothing beside the convolutions they feed
// (test-time augmentation and the speedrun's translate). Constant padding writes the input
// into a filled tensor: cat of constant blocks, so its gradient is the input's slice.
#include <algorithm>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/factory.h"

namespace loom {
namespace {

// The input position each output position reads, along a dim of `size` padded by before/after.
std::vector<int64_t> pad_index_map(const std::string& mode, int64_t size, int64_t before, int64_t after) {
  std::vector<int64_t> map;
  map.reserve(static_cast<size_t>(size + before + after));
  for (int64_t o = -before; o < size + after; ++o) {
    int64_t i = o;
    if (mode == "reflect") {
      const int64_t period = 2 * (size - 1);  // one bounce there and back; size 1 is refused
      i = ((i % period) + period) % period;
      if (i >= size) i = period - i;
    } else if (mode == "replicate") {
      i = std::min(std::max(i, int64_t{0}), size - 1);
    } else {  // circular
      i = ((i % size) + size) % size;
    }
    map.push_back(i);
  }
  return map;
}

Tensor index_tensor(const std::vector<int64_t>& map, const Tensor& like) {
  return from_vector(map, {static_cast<int64_t>(map.size())}).to(like.device());
}

}  // namespace

Tensor flip(const Tensor& x, const Shape& dims) {
  LOOM_CHECK(x.defined(), "flip: the input is undefined");
  Tensor out = x;
  std::vector<bool> seen(static_cast<size_t>(x.dim()), false);
  for (int64_t d : dims) {
    LOOM_CHECK(d >= -x.dim() && d < x.dim(), "flip: dim ", d, " is out of range for a ", x.dim(), "-D input of shape ",
               x.shape());
    const int64_t dim = d < 0 ? d + x.dim() : d;
    LOOM_CHECK(!seen[static_cast<size_t>(dim)], "flip: dim ", dim, " appears multiple times in the list of dims");
    seen[static_cast<size_t>(dim)] = true;
    std::vector<int64_t> map(static_cast<size_t>(x.size(dim)));
    for (int64_t i = 0; i < x.size(dim); ++i) map[static_cast<size_t>(i)] = x.size(dim) - 1 - i;
    out = index_select(out, dim, index_tensor(map, x));
  }
  return dims.empty() ? clone(x) : out;  // torch.flip always returns a new tensor
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& padding, const std::string& mode, double value) {
  LOOM_CHECK(x.defined(), "pad: the input is undefined");
  LOOM_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate" || mode == "circular",
             "pad: mode must be \"constant\", \"reflect\", \"replicate\" or \"circular\", got \"", mode, "\"");
  LOOM_CHECK(padding.size() % 2 == 0 && padding.size() / 2 <= static_cast<size_t>(x.dim()),
             "pad: padding holds (before, after) pairs for the last dims, last dim first, as F.pad's (left, right, "
             "top, bottom); got ", padding.size(), " values for a ", x.dim(), "-D input");
  LOOM_CHECK(mode == "constant" || value == 0, "pad: a fill value applies to mode \"constant\" only, got mode \"", mode,
             "\" with value ", value);
  Tensor out = x;
  for (size_t k = 0; k < padding.size() / 2; ++k) {
    const int64_t dim = x.dim() - 1 - static_cast<int64_t>(k);
    const int64_t before = padding[2 * k], after = padding[2 * k + 1], size = x.size(dim);
    if (before == 0 && after == 0) continue;
    if (mode == "constant") {
      LOOM_CHECK(before >= 0 && after >= 0, "pad: negative padding (cropping) is not supported, got (", before, ", ",
                 after, ") for dim ", dim);
      std::vector<Tensor> parts;
      auto block = [&](int64_t n) {
        Shape shape = out.shape();
        shape[dim] = n;
        return full(shape, value, TensorOptions(x.dtype()).device(x.device()));
      };
      if (before > 0) parts.push_back(block(before));
      parts.push_back(out);
      if (after > 0) parts.push_back(block(after));
      out = cat(parts, dim);
      continue;
    }
    LOOM_CHECK(before >= 0 && after >= 0, "pad: negative padding is not supported in mode \"", mode, "\", got (",
               before, ", ", after, ") for dim ", dim);
    if (mode == "reflect")
      LOOM_CHECK(before < size && after < size, "pad: reflect padding must be smaller than the dim it pads: padding (",
                 before, ", ", after, ") for dim ", dim, " of size ", size, " (input shape ", x.shape(), ")");
    if (mode == "circular")
      LOOM_CHECK(before <= size && after <= size, "pad: circular padding may wrap at most once: padding (", before,
                 ", ", after, ") for dim ", dim, " of size ", size);
    LOOM_CHECK(size > 0, "pad: cannot pad an empty dim ", dim, " in mode \"", mode, "\"");
    out = index_select(out, dim, index_tensor(pad_index_map(mode, size, before, after), x));  // See Note [Padding as an index map]
  }
  return out.is_same(x) ? clone(x) : out;  // nothing padded: still a new tensor, as F.pad
}

}  // namespace loom
