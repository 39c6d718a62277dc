// cpu_map: the elementwise loop every CPU pointwise kernel is written with.
//
//   cpu_map<float>(out, [](float a, float b) { return a + b; }, a, b);
//
// out[i] = f(in0[i], in1[i], ...) for every element, where all inputs already have
// out's shape (broadcast inputs are expand()ed views with stride 0; see core/kernels.h).
//
// Note [Elementwise loop shapes]
// 1. All operands contiguous: one flat loop the compiler vectorises, split across
//    OpenMP threads in chunks of at least kGrain elements.
// 2. Otherwise dims are first put in the output's memory order (largest stride first,
//    as PyTorch's TensorIterator does: a channels-last NCHW output is walked as N, H, W,
//    C; Note [Channels-last activations]), then *collapsed*: adjacent dims d, d+1 merge
//    when every operand has stride[d] == stride[d+1] * size[d+1] (true for contiguous
//    runs and for fully broadcast runs alike; operands that share the output's format
//    collapse to one flat run). What remains is iterated as outer rows x one inner dim;
//    rows are split across threads (a long single row in pieces). The inner loop runs
//    unit-stride when every operand has step 1 or 0 there (Note [Broadcast scalars in
//    the inner loop]), strided otherwise.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace loom::cpu {

constexpr int64_t kGrain = 32768;  // below this many elements, threads cost more than they save

// Dims and per-operand strides after Note [Elementwise loop shapes] step 2.
template <size_t N>
struct CollapsedLayout {
  Shape sizes;
  std::array<Shape, N> strides;
};

template <size_t N>
CollapsedLayout<N> collapse_dims(const Shape& shape, const std::array<const Shape*, N>& strides) {
  CollapsedLayout<N> layout;
  // Note [Elementwise loop shapes] step 2: dims in the output's memory order.
  std::vector<size_t> order(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) order[d] = d;
  const Shape& out_strides = *strides[0];
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return out_strides[a] > out_strides[b]; });
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t d = order[k];
    if (shape[d] == 1) continue;  // size-1 dims never move the pointer
    bool merge = !layout.sizes.empty();
    for (size_t k = 0; k < N && merge; ++k)
      merge = layout.strides[k].back() == (*strides[k])[d] * shape[d];
    if (merge) {
      layout.sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k) layout.strides[k].back() = (*strides[k])[d];
    } else {
      layout.sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k) layout.strides[k].push_back((*strides[k])[d]);
    }
  }
  if (layout.sizes.empty()) {  // a single element
    layout.sizes.push_back(1);
    for (size_t k = 0; k < N; ++k) layout.strides[k].push_back(0);
  }
  return layout;
}

namespace detail {

// Note [Broadcast scalars in the inner loop]
// `x * 0.5`, `grad / world`, `where(mask, x, 0)`: one operand is expand()ed along the
// inner dim (step 0). A loop indexing p[i * step] with a runtime step does not vectorise,
// and such a tensor often collapses to one long row, which the row split below cannot
// share between threads. So the inner dim is walked in blocks of kBlock elements: an
// operand with step 0 is read from a block-sized buffer filled with its one value, every
// other operand (unit step) in place, and the loop body sees only unit-stride pointers
// (`copy_(grad / world)` over 11 M floats went from 3.8 ms to about a plain copy's time).
// A row is further cut into `splits` pieces of at least kGrain elements when there are
// fewer rows than that, so that one long row still uses every thread.
constexpr int64_t kBlock = 256;
template <typename T>
using Block = std::array<T, kBlock>;

template <typename Out, typename... In, typename F, size_t... I>
void map_strided(Tensor& out, F& f, std::tuple<const In*...> in_ptrs, const CollapsedLayout<1 + sizeof...(In)>& layout,
                 std::index_sequence<I...>) {
  constexpr size_t N = 1 + sizeof...(In);
  Out* out_ptr = out.data_ptr<Out>();
  const int64_t n = out.numel();
  const int64_t ndim = static_cast<int64_t>(layout.sizes.size());
  const int64_t inner = layout.sizes.back();
  const int64_t rows = n / inner;
  std::array<int64_t, N> step;
  for (size_t k = 0; k < N; ++k) step[k] = layout.strides[k][ndim - 1];
  const bool blocked = step[0] == 1 && ((step[I + 1] <= 1 && step[I + 1] >= 0) && ...);
  const int64_t splits = rows >= 8 ? 1 : std::max<int64_t>(1, std::min<int64_t>(inner / kGrain, 64));
  const int64_t per_split = (inner + splits - 1) / splits;

#pragma omp parallel for schedule(static) if (n > kGrain && rows * splits > 1)
  for (int64_t task = 0; task < rows * splits; ++task) {
    const int64_t row = task / splits;
    const int64_t begin = (task % splits) * per_split, end = std::min(inner, begin + per_split);
    // The offset of this row in every operand, from the row's multi-index.
    std::array<int64_t, N> offset{};
    int64_t rest = row;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      int64_t index = rest % layout.sizes[d];
      rest /= layout.sizes[d];
      for (size_t k = 0; k < N; ++k) offset[k] += index * layout.strides[k][d];
    }
    Out* o = out_ptr + offset[0];
    std::tuple<const In*...> p{(std::get<I>(in_ptrs) + offset[I + 1])...};
    if (!blocked) {
      for (int64_t i = begin; i < end; ++i) o[i * step[0]] = f(std::get<I>(p)[i * step[I + 1]]...);
      continue;
    }
    // See Note [Broadcast scalars in the inner loop].
    std::tuple<Block<In>...> fill;
    const int64_t filled = std::min(kBlock, end - begin);  // a short row fills only what it reads
    ((step[I + 1] == 0 ? void(std::fill_n(std::get<I>(fill).data(), filled, std::get<I>(p)[0])) : void()), ...);
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t len = std::min(kBlock, end - b);
      std::tuple<const In*...> q{(step[I + 1] == 0 ? std::get<I>(fill).data() : std::get<I>(p) + b)...};
      Out* ob = o + b;
      for (int64_t i = 0; i < len; ++i) ob[i] = f(std::get<I>(q)[i]...);
    }
  }
}

// Note [The contiguous loop takes its pointers by value]
// The flat loop of Note [Elementwise loop shapes] step 1 is a function of its own whose
// output pointer, length, functor and input pointers are plain parameters. Written
// inline in a [&] lambda, it read them through the closure, and since a store through
// the output pointer might alias that closure, GCC reloaded them every iteration and
// vectorised nothing: float32 relu ran scalar, and bfloat16 kernels ran scalar with a
// branch per element (the NaN check of Note [bfloat16 conversion in registers], relu's
// compare), several times slower than float32. As parameters they are known not to
// change, and both vectorise.
template <typename Out, typename... In, typename F>
void map_contiguous(Out* out, int64_t n, F f, const In*... in) {
#pragma omp parallel for simd schedule(static) if (n > kGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = f(in[i]...);
}

// Note [Dense tensors map as flat memory]
// An elementwise map does not care in which order it visits elements, only that out[i] and
// in[i] are the same element. Tensors with the same shape and strides whose elements fill
// their memory without gaps or overlaps (NCHW-contiguous, channels-last, any permutation of
// a contiguous layout) put element i at the same offset from each base, so the contiguous
// loop runs over them as flat arrays. Without this a channels-last activation took the
// strided loop, which does not vectorise (GELU forward and backward, 6% of the speedrun's step).
inline bool dense_in_some_order(const Tensor& t) {
  const int64_t d = t.dim();
  std::vector<int64_t> order(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) < t.stride(b); });
  int64_t expected = 1;
  for (int64_t i : order) {
    if (t.size(i) == 1) continue;
    if (t.stride(i) != expected) return false;
    expected *= t.size(i);
  }
  return true;
}

}  // namespace detail

template <typename Out, typename... In, typename F, typename... Tensors>
void cpu_map_typed(Tensor& out, F f, const Tensors&... ins) {
  static_assert(sizeof...(In) == sizeof...(Tensors), "one element type per input tensor");
  constexpr size_t N = 1 + sizeof...(In);
  const int64_t n = out.numel();
  if (n == 0) return;
  std::tuple<const In*...> in_ptrs{static_cast<const In*>(ins.raw_data())...};

  if ((out.is_contiguous() && ... && ins.is_contiguous())) {
    Out* out_ptr = out.data_ptr<Out>();  // See Note [The contiguous loop takes its pointers by value]
    std::apply([&](const In*... in) { detail::map_contiguous<Out, In...>(out_ptr, n, f, in...); }, in_ptrs);
    return;
  }
  if (((ins.shape() == out.shape() && ins.strides() == out.strides()) && ...) && detail::dense_in_some_order(out)) {
    Out* out_ptr = out.data_ptr<Out>();  // See Note [Dense tensors map as flat memory]
    std::apply([&](const In*... in) { detail::map_contiguous<Out, In...>(out_ptr, n, f, in...); }, in_ptrs);
    return;
  }
  std::array<const Shape*, N> all_strides = {&out.strides(), &ins.strides()...};
  detail::map_strided<Out, In...>(out, f, in_ptrs, collapse_dims<N>(out.shape(), all_strides),
                                  std::index_sequence_for<In...>{});
}

// Visits every element of a single tensor in place: self[i] = f(self[i]).
template <typename T, typename F>
void cpu_apply_inplace(Tensor& self, F f) {
  cpu_map_typed<T, T>(self, f, self);
}

}  // namespace loom::cpu
