// CPU reductions: sum / mean / max / min over any set of dims, and max/min along one
// dim with indices.
//
// Note [Reduction layouts]
// The input is viewed as [kept..., reduced...] (a permutation, no copy), with K output
// elements and R elements reduced into each. Two layouts are common and get a fast
// path; everything else is copied into the first one:
//   inner: each output's R inputs are contiguous (sum over the last dims, row sums)
//          -> parallel over outputs, a vectorised inner loop;
//   outer: the kept dims are the trailing contiguous block (sum over the batch dim of
//          [N, C], the gradient of a broadcast bias) -> walk the R rows in order and
//          accumulate whole rows, parallel over column blocks.
// float32 accumulates in double: a sum over 10^6 elements stays exact to float precision.
#include <algorithm>
#include <limits>

#include "core/cpu/float32_staging.h"  // defines: float32_copy (Note [16-bit CPU kernels stage through float32])
#include "core/cpu/loops.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

template <typename T> struct Accumulate { using type = T; };
template <> struct Accumulate<float> { using type = double; };
template <> struct Accumulate<int32_t> { using type = int64_t; };
template <> struct Accumulate<uint8_t> { using type = int64_t; };
template <> struct Accumulate<bool> { using type = int64_t; };

template <typename T>
struct Reducer {
  using Acc = typename Accumulate<T>::type;
  ReduceOp op;
  Acc init() const {
    // -inf / +inf where the type has them: the max of [-inf, -inf] is -inf, not lowest().
    using Limits = std::numeric_limits<Acc>;
    if (op == ReduceOp::Max) return Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
    if (op == ReduceOp::Min) return Limits::has_infinity ? Limits::infinity() : Limits::max();
    return Acc(0);
  }
  Acc combine(Acc a, Acc b) const {
    // A NaN wins either way round (a != a), as in PyTorch: max([1, nan, 2]) is nan.
    if (op == ReduceOp::Max) return a > b || a != a ? a : b;
    if (op == ReduceOp::Min) return a < b || a != a ? a : b;
    return a + b;
  }
  T finish(Acc a, int64_t count) const {
    if (op == ReduceOp::Mean) return static_cast<T>(a / static_cast<Acc>(count));
    return static_cast<T>(a);
  }
};

// out[k] = reduce(in[k * R + r] for r < R), `in` contiguous.
template <typename T>
void reduce_inner(const Reducer<T>& red, const T* in, T* out, int64_t K, int64_t R) {
  using Acc = typename Reducer<T>::Acc;
  if (K == 1) {  // a full reduction: split R across threads, combine partials
    Acc total = red.init();
#pragma omp parallel if (R > kGrain)
    {
      Acc partial = red.init();
#pragma omp for schedule(static) nowait
      for (int64_t r = 0; r < R; ++r) partial = red.combine(partial, static_cast<Acc>(in[r]));
#pragma omp critical
      total = red.combine(total, partial);
    }
    out[0] = red.finish(total, R);
    return;
  }
#pragma omp parallel for schedule(static) if (K * R > kGrain)
  for (int64_t k = 0; k < K; ++k) {
    Acc acc = red.init();
    const T* row = in + k * R;
    if (red.op == ReduceOp::Sum || red.op == ReduceOp::Mean) {
      for (int64_t r = 0; r < R; ++r) acc += static_cast<Acc>(row[r]);
    } else {
      for (int64_t r = 0; r < R; ++r) acc = red.combine(acc, static_cast<Acc>(row[r]));
    }
    out[k] = red.finish(acc, R);
  }
}

// out[k] = reduce(in[r * K + k] for r < R), `in` contiguous.
template <typename T>
void reduce_outer(const Reducer<T>& red, const T* in, T* out, int64_t K, int64_t R) {
  using Acc = typename Reducer<T>::Acc;
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (K + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (K * R > kGrain && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, width = std::min(kBlock, K - begin);
    Acc acc[kBlock];
    for (int64_t j = 0; j < width; ++j) acc[j] = red.init();
    for (int64_t r = 0; r < R; ++r) {
      const T* row = in + r * K + begin;
      for (int64_t j = 0; j < width; ++j) acc[j] = red.combine(acc[j], static_cast<Acc>(row[j]));
    }
    for (int64_t j = 0; j < width; ++j) out[begin + j] = red.finish(acc[j], R);
  }
}

void reduce_cpu(ReduceOp op, const Tensor& in, const std::vector<int64_t>& dims, Tensor& out) {
  if (is_16bit_float(in.dtype())) {  // See Note [16-bit CPU kernels stage through float32]
    Tensor out32 = float32_like(out);
    reduce_cpu(op, float32_copy(in), dims, out32);
    return round_into(out32, out);
  }
  dispatch_all(in.dtype(), "reduction", [&]<typename T>() {
    const size_t ndim = in.shape().size();
    std::vector<bool> reduced(ndim, false);
    for (int64_t d : dims) reduced[static_cast<size_t>(d)] = true;
    Shape kept_first, reduced_last;
    for (size_t d = 0; d < ndim; ++d) (reduced[d] ? reduced_last : kept_first).push_back(static_cast<int64_t>(d));
    const int64_t R = [&] { int64_t r = 1; for (int64_t d : reduced_last) r *= in.shape()[d]; return r; }();
    const int64_t K = in.numel() / std::max<int64_t>(R, 1);
    const Reducer<T> red{op};
    T* out_ptr = out.data_ptr<T>();
    if (in.numel() == 0) {  // PyTorch: sum of nothing is 0, mean is nan, max errors
      LOOM_CHECK(op == ReduceOp::Sum || op == ReduceOp::Mean, "max/min of an empty tensor is undefined");
      for (int64_t k = 0; k < out.numel(); ++k) out_ptr[k] = op == ReduceOp::Sum ? T(0) : static_cast<T>(std::numeric_limits<double>::quiet_NaN());
      return;
    }

    // Layout [kept..., reduced...]: the "inner" case of Note [Reduction layouts].
    Shape order = kept_first;
    order.insert(order.end(), reduced_last.begin(), reduced_last.end());
    Tensor inner_view = in.detach().permute(order);
    if (inner_view.is_contiguous()) {
      return reduce_inner(red, static_cast<const T*>(in.raw_data()), out_ptr, K, R);
    }
    // Layout [reduced..., kept...] with the kept block contiguous: the "outer" case.
    Shape outer_order = reduced_last;
    outer_order.insert(outer_order.end(), kept_first.begin(), kept_first.end());
    Tensor outer_view = in.detach().permute(outer_order);
    if (outer_view.is_contiguous()) {
      return reduce_outer(red, static_cast<const T*>(in.raw_data()), out_ptr, K, R);
    }
    Tensor packed = empty(inner_view.shape(), TensorOptions(in.dtype()));
    cpu_map_typed<T, T>(packed, [](T x) { return x; }, inner_view);
    reduce_inner(red, packed.data_ptr<T>(), out_ptr, K, R);
  });
}

void max_min_dim_cpu(bool is_max, const Tensor& in, int64_t dim, Tensor& values, Tensor& indices) {
  if (is_16bit_float(in.dtype())) {  // See Note [16-bit CPU kernels stage through float32]
    Tensor values32 = float32_like(values);
    max_min_dim_cpu(is_max, float32_copy(in), dim, values32, indices);
    return round_into(values32, values);
  }
  dispatch_all(in.dtype(), is_max ? "max" : "min", [&]<typename T>() {
    const int64_t size = in.shape()[static_cast<size_t>(dim)];
    LOOM_CHECK(size > 0, is_max ? "max" : "min", "(): cannot reduce over an empty dimension ", dim);
    // Move `dim` last and pack: each output then scans one contiguous run.
    Shape order;
    for (int64_t d = 0; d < in.dim(); ++d)
      if (d != dim) order.push_back(d);
    order.push_back(dim);
    Tensor view = in.detach().permute(order);
    Tensor packed = view;
    if (!view.is_contiguous()) {
      packed = empty(view.shape(), TensorOptions(in.dtype()));
      cpu_map_typed<T, T>(packed, [](T x) { return x; }, view);
    }
    const T* src = packed.data_ptr<T>();
    T* val = values.data_ptr<T>();
    int64_t* idx = indices.data_ptr<int64_t>();
    const int64_t K = in.numel() / size;
#pragma omp parallel for schedule(static) if (in.numel() > kGrain)
    for (int64_t k = 0; k < K; ++k) {
      const T* row = src + k * size;
      // A NaN is the extreme, and the first one wins (PyTorch): the scan stops at it.
      int64_t best = 0;
      const bool first_is_nan = row[0] != row[0];
      for (int64_t i = 1; i < size && !first_is_nan; ++i) {
        if (row[i] != row[i]) {
          best = i;
          break;
        }
        if (is_max ? row[i] > row[best] : row[i] < row[best]) best = i;
      }
      val[k] = row[best];
      idx[k] = best;
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(reduce_kernel, DeviceType::CPU, reduce_cpu);
LOOM_REGISTER_KERNEL(max_min_dim_kernel, DeviceType::CPU, max_min_dim_cpu);

}  // namespace loom::cpu
