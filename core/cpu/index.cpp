// CPU indexing kernels: gather and scatter_add, and their one-index-per-slice forms
// index_select and index_add. Every dtype of dispatch_all; indices are int64.
//
// Note [Index kernels as one loop]
// All four are a single loop over an iteration shape with three operands:
//   gather:       over index's shape:  out[p]                              = in[base(p) + index[p] * in.stride(dim)]
//   scatter_add:  over index's shape:  out[base(p) + index[p] * out.stride(dim)] += src[p]
// where base(p) is p's offset in the indexed tensor with its `dim` coordinate taken as 0
// (that tensor's strides with stride[dim] = 0). index_select is gather whose index is
// the 1-D index laid along `dim` (stride 0 in every other dim, so a whole slice reads
// one index value); index_add is scatter_add with the same trick. The loop itself
// collapses dims as cpu_map does (Note [Elementwise loop shapes]).
//
// Note [Scatter without races]
// Two positions of a scatter_add write the same output element only when they differ in
// their `dim` coordinate alone (a repeated index). So threads split the loop along some
// other dimension and each walks its share, all of `dim` included, serially: no atomics,
// and the summation order is the same on every run. gather writes each output element
// once, so it may split along any dimension.
//
// Indices are validated in a serial pass before the loop: an out-of-range index is a
// loom::Error naming the index, the dim and its size, never a write out of bounds (and
// never an exception thrown inside an OpenMP region, which would terminate).
#include <array>
#include <type_traits>

#include "core/cpu/loops.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

// Calls body(offsets) for every position p of `shape`, offsets[k] being p's offset under
// strides[k]. Threads split dimension `split` (serial when split < 0); each thread walks
// the other dims in order.
template <size_t N, typename F>
void for_each_position(const Shape& shape, const std::array<Shape, N>& strides, int64_t split, F&& body) {
  const int64_t total = numel(shape);
  if (total == 0) return;
  Shape sub_shape = shape;
  std::array<Shape, N> sub_strides = strides;
  std::array<int64_t, N> part_step{};
  int64_t parts = 1;
  if (split >= 0) {
    parts = shape[split];
    sub_shape.erase(sub_shape.begin() + split);
    for (size_t k = 0; k < N; ++k) {
      part_step[k] = strides[k][split];
      sub_strides[k].erase(sub_strides[k].begin() + split);
    }
  }
  std::array<const Shape*, N> stride_ptrs;
  for (size_t k = 0; k < N; ++k) stride_ptrs[k] = &sub_strides[k];
  const CollapsedLayout<N> layout = collapse_dims<N>(sub_shape, stride_ptrs);
  const int64_t ndim = static_cast<int64_t>(layout.sizes.size());
  const int64_t inner = layout.sizes.back();
  const int64_t rows = numel(sub_shape) / inner;
  std::array<int64_t, N> step;
  for (size_t k = 0; k < N; ++k) step[k] = layout.strides[k][ndim - 1];

#pragma omp parallel for schedule(static) if (parts > 1 && total > kGrain)
  for (int64_t part = 0; part < parts; ++part) {
    for (int64_t row = 0; row < rows; ++row) {
      std::array<int64_t, N> offset;
      for (size_t k = 0; k < N; ++k) offset[k] = part * part_step[k];
      int64_t rest = row;
      for (int64_t d = ndim - 2; d >= 0; --d) {
        const int64_t i = rest % layout.sizes[d];
        rest /= layout.sizes[d];
        for (size_t k = 0; k < N; ++k) offset[k] += i * layout.strides[k][d];
      }
      for (int64_t i = 0; i < inner; ++i) {
        body(offset);
        for (size_t k = 0; k < N; ++k) offset[k] += step[k];
      }
    }
  }
}

// The largest dimension other than `except` (-1 if there is none worth splitting).
int64_t split_dim(const Shape& shape, int64_t except) {
  int64_t best = -1;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d != except && shape[d] > 1 && (best < 0 || shape[d] > shape[best])) best = d;
  }
  return best;
}

void check_indices(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  LOOM_CHECK(index.dtype() == kInt64, op, ": expected an int64 index tensor, got ", index.dtype());
  const int64_t* values = index.data_ptr<int64_t>();
  bool bad = false;
  int64_t first_bad = 0;
  for_each_position<1>(index.shape(), {index.strides()}, -1, [&](const std::array<int64_t, 1>& o) {
    const int64_t v = values[o[0]];
    if (!bad && (v < 0 || v >= size)) {
      bad = true;
      first_bad = v;
    }
  });
  LOOM_CHECK(!bad, op, ": index ", first_bad, " is out of bounds for dimension ", dim, " with size ", size,
             " (valid indices are 0..", size - 1, ")");
}

// `strides` with the `dim` entry zeroed: base(p) of Note [Index kernels as one loop].
Shape without_dim(Shape strides, int64_t dim) {
  strides[dim] = 0;
  return strides;
}

// A 1-D (or 0-dim) index viewed with `shape`, varying only along `dim`.
Tensor along_dim(const Tensor& index, int64_t dim, const Shape& shape) {
  Shape strides(shape.size(), 0);
  strides[dim] = index.dim() == 0 ? 0 : index.stride(0);
  return make_tensor(index.storage(), shape, std::move(strides), index.storage_offset(), index.dtype());
}

template <typename T>
void gather_loop(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out) {
  const T* src = static_cast<const T*>(in.raw_data());
  T* dst = out.data_ptr<T>();
  const int64_t* idx = index.data_ptr<int64_t>();
  const int64_t step = in.stride(dim);
  for_each_position<3>(index.shape(), {out.strides(), index.strides(), without_dim(in.strides(), dim)},
                       split_dim(index.shape(), -1),
                       [&](const std::array<int64_t, 3>& o) { dst[o[0]] = src[o[2] + idx[o[1]] * step]; });
}

template <typename T>
void scatter_add_loop(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  if constexpr (std::is_same_v<T, bool>) {
    LOOM_FAIL("scatter_add/index_add: adding bool tensors is not supported; convert with .to(kInt64) first");
  } else {
    T* dst = out.data_ptr<T>();
    const T* from = static_cast<const T*>(src.raw_data());
    const int64_t* idx = index.data_ptr<int64_t>();
    const int64_t step = out.stride(dim);
    // Note [Scatter without races]: never split along dim.
    for_each_position<3>(index.shape(), {src.strides(), index.strides(), without_dim(out.strides(), dim)},
                         split_dim(index.shape(), dim),
                         [&](const std::array<int64_t, 3>& o) { dst[o[2] + idx[o[1]] * step] += from[o[0]]; });
  }
}

void gather_cpu(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out) {
  check_indices("gather", index, dim, in.size(dim));
  dispatch_all(in.dtype(), "gather", [&]<typename T>() { gather_loop<T>(in, dim, index, out); });
}

void scatter_add_cpu(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  check_indices("scatter_add", index, dim, out.size(dim));
  dispatch_all(out.dtype(), "scatter_add", [&]<typename T>() { scatter_add_loop<T>(out, dim, index, src); });
}

void index_select_cpu(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out) {
  check_indices("index_select", index, dim, in.size(dim));
  Tensor spread = along_dim(index, dim, out.shape());
  dispatch_all(in.dtype(), "index_select", [&]<typename T>() { gather_loop<T>(in, dim, spread, out); });
}

void index_add_cpu(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  check_indices("index_add", index, dim, out.size(dim));
  Tensor spread = along_dim(index, dim, src.shape());
  dispatch_all(out.dtype(), "index_add", [&]<typename T>() { scatter_add_loop<T>(out, dim, spread, src); });
}

}  // namespace

LOOM_REGISTER_KERNEL(index_select_kernel, DeviceType::CPU, index_select_cpu);
LOOM_REGISTER_KERNEL(index_add_kernel, DeviceType::CPU, index_add_cpu);
LOOM_REGISTER_KERNEL(gather_kernel, DeviceType::CPU, gather_cpu);
LOOM_REGISTER_KERNEL(scatter_add_kernel, DeviceType::CPU, scatter_add_cpu);

}  // namespace loom::cpu
