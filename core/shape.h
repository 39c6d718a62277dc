// Shape and strides: a tensor's extent per dimension and the element step per dimension.
//
// A view (transpose, narrow, expand, ...) changes only shape, strides and offset over
// the same storage. Broadcasting follows NumPy/PyTorch: shapes are aligned at the right,
// and a dimension of size 1 stretches to match the other.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace loom {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);
// Row-major ("C-contiguous") strides for a shape.
Shape contiguous_strides(const Shape& shape);
// step * max(size, 1), or INT64_MAX where that overflows: the next stride of a dense
// layout. A shape that overflows has more elements than an int64 counts, which the
// factories and contiguous() refuse with a clear error; computing its strides on the way
// there must not be undefined behaviour (UBSan found it: test_tensor's expand to 9 x 6e18).
int64_t saturating_stride_step(int64_t step, int64_t size);
// "[2, 3, 4]", for messages.
std::string shape_str(const Shape& shape);
// The broadcast of two shapes; a loom::Error naming both shapes if they don't broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Wraps a possibly negative dimension index into [0, ndim); error names the valid range.
// As wrap_dim, but a 0-d tensor takes dim 0 or -1 (returned as 0), as PyTorch's
// reductions and squeeze do: sum(scalar, {0}) is the scalar.
int64_t wrap_dim_or_scalar(int64_t dim, int64_t ndim);
int64_t wrap_dim(int64_t dim, int64_t ndim);

}  // namespace loom

namespace std {
// So LOOM_CHECK(..., "got ", shape) prints "[2, 3]".
inline ostream& operator<<(ostream& out, const loom::Shape& shape) { return out << loom::shape_str(shape); }
}  // namespace std
