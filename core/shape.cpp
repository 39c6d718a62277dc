#include "core/shape.h"

#include "core/error.h"

namespace loom {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t size : shape) {
    // An overflowing product would make a tensor smaller than its shape says: an error
    // here rather than reads and writes past its storage later.
    LOOM_CHECK(!__builtin_mul_overflow(n, size, &n), "shape ", shape_str(shape),
               " has more elements than an int64 can count");
  }
  return n;
}

int64_t saturating_stride_step(int64_t step, int64_t size) {
  int64_t out = 0;
  return __builtin_mul_overflow(step, std::max<int64_t>(size, 1), &out) ? INT64_MAX : out;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t step = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = step;
    step = saturating_stride_step(step, shape[d]);
  }
  return strides;
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    int64_t sa = i < a.size() ? a[a.size() - 1 - i] : 1;
    int64_t sb = i < b.size() ? b[b.size() - 1 - i] : 1;
    LOOM_CHECK(sa == sb || sa == 1 || sb == 1, "shapes ", shape_str(a), " and ", shape_str(b),
               " cannot be broadcast: dimension ", ndim - 1 - i, " (from the right: ", i,
               ") is ", sa, " vs ", sb, "; sizes must be equal or one of them 1");
    out[ndim - 1 - i] = sa == 1 ? sb : sa;
  }
  return out;
}

int64_t wrap_dim_or_scalar(int64_t dim, int64_t ndim) {
  if (ndim > 0) return wrap_dim(dim, ndim);
  LOOM_CHECK(dim == 0 || dim == -1, "dimension out of range: a 0-d tensor (a scalar) takes dim 0 or -1 here, got ",
             dim);
  return 0;
}

int64_t wrap_dim(int64_t dim, int64_t ndim) {
  LOOM_CHECK(ndim > 0, "dimension out of range: a 0-d tensor (a scalar) has no dimensions, got dim ", dim);
  LOOM_CHECK(dim >= -ndim && dim < ndim, "dimension out of range: expected in [", -ndim, ", ", ndim - 1, "], got ",
             dim);
  return dim < 0 ? dim + ndim : dim;
}

}  // namespace loom
