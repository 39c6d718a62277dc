#include "parallel/checkpoint/chunks.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace loom::distributed::checkpoint {

int64_t Chunk::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string Chunk::str() const {
  std::ostringstream out;
  out << "[";
  for (size_t d = 0; d < sizes.size(); ++d)
    out << (d ? ", " : "") << offsets[d] << ":" << offsets[d] + sizes[d];
  out << "]";
  return out.str();
}

Chunk whole_chunk(const Shape& shape) { return {std::vector<int64_t>(shape.size(), 0), shape}; }

std::optional<Chunk> intersect(const Chunk& a, const Chunk& b) {
  LOOM_CHECK(a.sizes.size() == b.sizes.size(), "intersect: chunks ", a.str(), " and ", b.str(),
             " have different numbers of dimensions");
  Chunk out{a.offsets, a.sizes};
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    const int64_t begin = std::max(a.offsets[d], b.offsets[d]);
    const int64_t end = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (end <= begin) return std::nullopt;
    out.offsets[d] = begin;
    out.sizes[d] = end - begin;
  }
  return out;
}

Chunk relative_to(const Chunk& inner, const Chunk& outer) {
  Chunk out = inner;
  for (size_t d = 0; d < inner.sizes.size(); ++d) {
    out.offsets[d] -= outer.offsets[d];
    LOOM_CHECK(out.offsets[d] >= 0 && out.offsets[d] + inner.sizes[d] <= outer.sizes[d], "chunk ", inner.str(),
               " does not lie within ", outer.str());
  }
  return out;
}

void check_within(const Chunk& chunk, const Shape& shape, const std::string& what) {
  bool fits = chunk.offsets.size() == shape.size() && chunk.sizes.size() == shape.size();
  for (size_t d = 0; fits && d < shape.size(); ++d)
    fits = chunk.offsets[d] >= 0 && chunk.sizes[d] >= 0 && chunk.offsets[d] + chunk.sizes[d] <= shape[d];
  LOOM_CHECK(fits, what, ": chunk ", chunk.str(), " does not lie within a tensor of shape ", shape);
}

namespace {

// Elements [begin, end) of the sub-tensor shape[d:] at index `prefix` of the dims before d,
// appended to `out` as boxes (the prefix dims of size 1).
void flat_range_boxes(const Shape& shape, size_t d, std::vector<int64_t>& prefix, int64_t begin, int64_t end,
                      std::vector<Chunk>& out) {
  if (begin >= end) return;
  const size_t ndim = shape.size();
  int64_t inner = 1;  // elements per index of dim d
  for (size_t k = d + 1; k < ndim; ++k) inner *= shape[k];
  auto box = [&](int64_t first, int64_t count) {  // indices [first, first + count) of dim d, all of the rest
    Chunk c;
    c.offsets = prefix;
    c.sizes.assign(prefix.size(), 1);
    c.offsets.push_back(first);
    c.sizes.push_back(count);
    for (size_t k = d + 1; k < ndim; ++k) {
      c.offsets.push_back(0);
      c.sizes.push_back(shape[k]);
    }
    out.push_back(std::move(c));
  };
  auto partial = [&](int64_t index, int64_t b, int64_t e) {  // part of one index of dim d
    prefix.push_back(index);
    flat_range_boxes(shape, d + 1, prefix, b, e, out);
    prefix.pop_back();
  };
  const int64_t first_row = begin / inner, last_row = (end - 1) / inner;
  if (first_row == last_row) {
    if (end - begin == inner) box(first_row, 1);
    else partial(first_row, begin - first_row * inner, end - first_row * inner);
    return;
  }
  const int64_t full_begin = (begin + inner - 1) / inner, full_end = end / inner;
  if (begin % inner) partial(first_row, begin % inner, inner);
  if (full_begin < full_end) box(full_begin, full_end - full_begin);
  if (end % inner) partial(full_end, 0, end % inner);
}

}  // namespace

std::vector<Chunk> chunks_of_flat_range(const Shape& shape, int64_t begin, int64_t end) {
  const int64_t n = loom::numel(shape);
  LOOM_CHECK(0 <= begin && begin <= end && end <= n, "chunks_of_flat_range: elements [", begin, ", ", end,
             ") of a tensor of shape ", shape, " (", n, " elements)");
  std::vector<Chunk> out;
  if (begin == end) return out;
  if (shape.empty()) return {Chunk{}};  // a 0-d tensor's one element
  std::vector<int64_t> prefix;
  flat_range_boxes(shape, 0, prefix, begin, end, out);
  return out;
}

}  // namespace loom::distributed::checkpoint
