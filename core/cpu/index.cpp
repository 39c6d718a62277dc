// CPU indexing kernels: gather and scatter_add, and their one-index-per-slice forms
// index_select and index_add. Every dtype of dispatch_all; indices are int64.
//
// Note [Index kernels as one loop]
// All four are a single loop over index's shape, with three operands:
//   gather:       out[p] = in[base(p) + index[p] * in.stride(dim)]
//   scatter_add:  out[base(p) + index[p] * out.stride(dim)] += src[p]
// where base(p) is p's offset in the indexed tensor with its `dim` coordinate taken as 0
// (that tensor's strides with stride[dim] = 0). index_select is gather whose index is
// the 1-D index laid along `dim` (stride 0 in every other dim, so a whole slice reads
// one index value); index_add is scatter_add with the same trick. The loop collapses
// dims as cpu_map does (Note [Elementwise loop shapes]) and works in runs along the
// innermost dim; a run that reads a single index value (index_select, index_add over
// rows) is a plain row copy or row add.
//
// Note [Scatter without races]
// Two positions of a scatter_add write the same output element only when they differ in
// their `dim` coordinate alone (a repeated index). So threads split the loop into blocks
// of some other dimension and each walks its block, all of `dim` included, serially: no
// atomics, and the summation order is the same on every run. gather writes each output
// element once, so it may split along any dimension.
//
// Indices are validated in a serial pass before the loop: an out-of-range index is a
// loom::Error naming the index, the dim and its size, never a write out of bounds (and
// never an exception thrown inside an OpenMP region, which would terminate).
#include <omp.h>

#include <algorithm>
#include <array>
#include <type_traits>

#include "core/cpu/loops.h"
#include "core/index_layout.h"  // defines: without_dim, along_dim, check_index_*
#include "core/kernels.h"

namespace loom::cpu {
namespace {

template <size_t N>
using Offsets = std::array<int64_t, N>;

// Walks `shape` in row-major order as runs along its innermost (collapsed) dim, calling
// run(at, n, step): n positions whose offsets in operand k are at[k] + i * step[k].
template <size_t N, typename F>
void walk_runs(const Shape& shape, const std::array<Shape, N>& strides, const Offsets<N>& base, F& run) {
  std::array<const Shape*, N> stride_ptrs;
  for (size_t k = 0; k < N; ++k) stride_ptrs[k] = &strides[k];
  const CollapsedLayout<N> layout = collapse_dims<N>(shape, stride_ptrs);
  const int64_t ndim = static_cast<int64_t>(layout.sizes.size());
  const int64_t inner = layout.sizes.back();
  const int64_t rows = numel(shape) / inner;
  Offsets<N> step;
  for (size_t k = 0; k < N; ++k) step[k] = layout.strides[k][ndim - 1];
  for (int64_t row = 0; row < rows; ++row) {
    Offsets<N> at = base;
    int64_t rest = row;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      const int64_t i = rest % layout.sizes[d];
      rest /= layout.sizes[d];
      for (size_t k = 0; k < N; ++k) at[k] += i * layout.strides[k][d];
    }
    run(at, inner, step);
  }
}

// walk_runs over all of `shape`, with threads taking contiguous blocks of dimension
// `split` (serial when split < 0 or the work is small). Each thread walks its block in
// row-major order, so inner runs stay contiguous whichever dim is split.
template <size_t N, typename F>
void for_each_run(const Shape& shape, const std::array<Shape, N>& strides, int64_t split, F&& run) {
  const int64_t total = numel(shape);
  if (total == 0) return;
  const int64_t blocks =
      split < 0 || total <= kGrain ? 1 : std::min<int64_t>(shape[split], omp_get_max_threads());
  if (blocks <= 1) return walk_runs<N>(shape, strides, Offsets<N>{}, run);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = shape[split] * b / blocks, hi = shape[split] * (b + 1) / blocks;
    Shape block = shape;
    block[split] = hi - lo;
    Offsets<N> base;
    for (size_t k = 0; k < N; ++k) base[k] = lo * strides[k][split];
    walk_runs<N>(block, strides, base, run);
  }
}

// The dimension threads split (other than `except`; -1 when none is worth it): the
// outermost one with a slice for every thread, so that each thread's walk stays in
// contiguous runs, else the largest.
int64_t split_dim(const Shape& shape, int64_t except) {
  const int64_t threads = omp_get_max_threads();
  int64_t largest = -1;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d == except || shape[d] <= 1) continue;
    if (shape[d] >= threads) return d;
    if (largest < 0 || shape[d] > shape[largest]) largest = d;
  }
  return largest;
}

void check_indices(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  check_index_dtype(op, index);
  const int64_t* values = index.data_ptr<int64_t>();
  bool bad = false;
  int64_t first_bad = 0;
  for_each_run<1>(index.shape(), {index.strides()}, -1, [&](const Offsets<1>& at, int64_t n, const Offsets<1>& step) {
    for (int64_t i = 0; i < n && !bad; ++i) {
      const int64_t v = values[at[0] + i * step[0]];
      if (v < 0 || v >= size) {
        bad = true;
        first_bad = v;
      }
    }
  });
  check_index_in_bounds(op, bad, first_bad, dim, size);
}

template <typename T>
void gather_loop(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out) {
  const T* src = static_cast<const T*>(in.raw_data());
  T* dst = out.data_ptr<T>();
  const int64_t* idx = index.data_ptr<int64_t>();
  const int64_t step = in.stride(dim);
  auto run = [&](const Offsets<3>& at, int64_t n, const Offsets<3>& st) {
    T* d = dst + at[0];
    const int64_t* ix = idx + at[1];
    const T* s = src + at[2];
    if (st[1] == 0) {  // one index for the whole run (index_select's rows): a row copy
      const T* row = s + ix[0] * step;
      if (st[0] == 1 && st[2] == 1) {
        std::copy(row, row + n, d);
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * st[0]] = row[i * st[2]];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * st[0]] = s[i * st[2] + ix[i * st[1]] * step];
    }
  };
  for_each_run<3>(index.shape(), {out.strides(), index.strides(), without_dim(in.strides(), dim)},
                  split_dim(index.shape(), -1), run);
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
    auto run = [&](const Offsets<3>& at, int64_t n, const Offsets<3>& st) {
      const T* s = from + at[0];
      const int64_t* ix = idx + at[1];
      T* d = dst + at[2];
      if (st[1] == 0) {  // one index for the whole run (index_add's rows): a row add
        T* row = d + ix[0] * step;
        if (st[0] == 1 && st[2] == 1) {
          for (int64_t i = 0; i < n; ++i) row[i] += s[i];
        } else {
          for (int64_t i = 0; i < n; ++i) row[i * st[2]] += s[i * st[0]];
        }
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * st[2] + ix[i * st[1]] * step] += s[i * st[0]];
      }
    };
    // Note [Scatter without races]: never split along dim.
    for_each_run<3>(index.shape(), {src.strides(), index.strides(), without_dim(out.strides(), dim)},
                    split_dim(index.shape(), dim), run);
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
