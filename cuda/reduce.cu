// CUDA reductions: sum / mean / max / min over any set of dims (reduce_kernel), and
// max / min along one dim with the index of the first extreme (max_min_dim_kernel),
// mirroring core/cpu/reduce.cpp.
//
// Note [GPU reduction layouts]
// As on the CPU (Note [Reduction layouts]), the input is seen as K outputs of R inputs:
//   rows:    [K, R] contiguous (reduced dims innermost; anything else is packed into
//            this layout first with copy_on_device). One block per output row: threads
//            stride over the row, then a warp-shuffle + shared-memory tree.
//   columns: [R, K] contiguous (the kept dims innermost: the batch sum of [N, C], a
//            bias gradient). One thread per output column walks down the rows, so a
//            warp reads 32 neighbouring columns at once (coalesced) without a transpose.
// Two-stage: when those give too few blocks to fill the GPU (a full reduction has
// K = 1; a bias gradient has small K), R is split into S chunks reduced in parallel
// into partials [K, S] (rows) or [S, K] (columns) kept in the accumulation type, and a
// second launch of the same kernels reduces the partials and finishes (mean divides
// by the original R).
//
// Accumulation: float (and 16-bit floats) in float, double in double, int64 in int64.
// The CPU accumulates float in double, so float sums agree to about 1e-6 relative, not
// bit for bit. A NaN wins max and min, and the first NaN argmax/argmin, as on the CPU.
#include <algorithm>
#include <limits>

#include "core/kernels.h"
#include "cuda/copy.h"     // defines: copy_on_device, contiguous_on_device
#include "cuda/loops.cuh"  // defines: dispatch_types, widen, narrow, kBlockSize

namespace loom::cuda {
namespace {

template <typename Acc>
struct Reducer {
  ReduceOp op;

  __device__ Acc init() const {
    if constexpr (std::numeric_limits<Acc>::has_infinity) {
      if (op == ReduceOp::Max) return -std::numeric_limits<Acc>::infinity();
      if (op == ReduceOp::Min) return std::numeric_limits<Acc>::infinity();
    } else {
      if (op == ReduceOp::Max) return std::numeric_limits<Acc>::lowest();
      if (op == ReduceOp::Min) return std::numeric_limits<Acc>::max();
    }
    return Acc(0);
  }
  __device__ Acc combine(Acc a, Acc b) const {
    if (op == ReduceOp::Max) return a > b || a != a ? a : b;  // NaN wins, as on the CPU
    if (op == ReduceOp::Min) return a < b || a != a ? a : b;
    return a + b;
  }
  template <typename Out>
  __device__ Out finish(Acc a, int64_t count, bool final) const {
    if (final && op == ReduceOp::Mean) a = a / static_cast<Acc>(count);
    return narrow<Out>(a);
  }
};

// Combines one value per thread into thread 0's result (blockDim.x a multiple of 32).
template <typename Acc>
__device__ Acc block_reduce(Acc value, const Reducer<Acc>& red) {
  __shared__ Acc warp_results[kBlockSize / 32];
  for (int offset = 16; offset > 0; offset /= 2) value = red.combine(value, __shfl_down_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < static_cast<int>(blockDim.x / 32) ? warp_results[lane] : red.init();
    for (int offset = 16; offset > 0; offset /= 2) value = red.combine(value, __shfl_down_sync(0xffffffffu, value, offset));
  }
  __syncthreads();  // warp_results is reused by the next row of this block
  return value;
}

// Rows layout: block (x, y) reduces chunk y of rows x, x + gridDim.x, ... of in[K, R]
// into out[row * gridDim.y + y]. `final`: finish (mean) and write the output type.
template <typename In, typename Acc, typename Out>
__global__ void __launch_bounds__(kBlockSize)
    reduce_rows_kernel(Reducer<Acc> red, const In* in, int64_t K, int64_t R, int64_t chunk, Out* out,
                       int64_t mean_count, bool final) {
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = begin + chunk < R ? begin + chunk : R;
  for (int64_t row = blockIdx.x; row < K; row += gridDim.x) {
    const In* p = in + row * R;
    Acc acc = red.init();
    for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) acc = red.combine(acc, static_cast<Acc>(widen(p[r])));
    acc = block_reduce(acc, red);
    if (threadIdx.x == 0) out[row * gridDim.y + blockIdx.y] = red.template finish<Out>(acc, mean_count, final);
  }
}

// Columns layout: thread k of chunk y reduces in[r, k] for r in chunk y into
// out[y * K + k].
template <typename In, typename Acc, typename Out>
__global__ void __launch_bounds__(kBlockSize)
    reduce_columns_kernel(Reducer<Acc> red, const In* in, int64_t K, int64_t R, int64_t chunk, Out* out,
                          int64_t mean_count, bool final) {
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = begin + chunk < R ? begin + chunk : R;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < K; k += step) {
    Acc acc = red.init();
    for (int64_t r = begin; r < end; ++r) acc = red.combine(acc, static_cast<Acc>(widen(in[r * K + k])));
    out[blockIdx.y * K + k] = red.template finish<Out>(acc, mean_count, final);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How many chunks to split R into so that about `target` blocks run (1: single pass).
int64_t choose_splits(int64_t blocks, int64_t R, int64_t min_chunk, int64_t target) {
  if (blocks >= target || R < 2 * min_chunk) return 1;
  return std::min({ceil_div(target, blocks), ceil_div(R, min_chunk), int64_t{65535}});
}

template <typename T>
void reduce_rows(ReduceOp op, const T* in, int64_t K, int64_t R, T* out, int device, Stream stream) {
  using Acc = compute_t<T>;  // see "Accumulation" above
  const Reducer<Acc> red{op};
  const int64_t target = 4 * multiprocessor_count(device);
  const auto row_blocks = static_cast<unsigned>(std::min<int64_t>(K, 65535 * 64));
  const int64_t splits = choose_splits(K, R, 16 * kBlockSize, target);
  if (splits == 1) {
    reduce_rows_kernel<T, Acc, T><<<dim3(row_blocks, 1), kBlockSize, 0, stream.handle>>>(red, in, K, R, R, out, R, true);
    LOOM_CUDA_CHECK_LAUNCH("reduction (rows)");
    return;
  }
  const int64_t chunk = ceil_div(R, splits);
  Tensor partial = empty({K, splits}, TensorOptions(device_dtype<Acc>()).device(Device(DeviceType::CUDA, device)));
  Acc* partial_ptr = static_cast<Acc*>(partial.raw_data());
  reduce_rows_kernel<T, Acc, Acc><<<dim3(row_blocks, static_cast<unsigned>(splits)), kBlockSize, 0, stream.handle>>>(
      red, in, K, R, chunk, partial_ptr, R, false);
  LOOM_CUDA_CHECK_LAUNCH("reduction (rows, stage 1)");
  reduce_rows_kernel<Acc, Acc, T><<<dim3(row_blocks, 1), kBlockSize, 0, stream.handle>>>(red, partial_ptr, K, splits,
                                                                                        splits, out, R, true);
  LOOM_CUDA_CHECK_LAUNCH("reduction (rows, stage 2)");
}

template <typename T>
void reduce_columns(ReduceOp op, const T* in, int64_t K, int64_t R, T* out, int device, Stream stream) {
  using Acc = compute_t<T>;  // see "Accumulation" above
  const Reducer<Acc> red{op};
  const int64_t target = 4 * multiprocessor_count(device);
  const int64_t column_blocks = std::min<int64_t>(ceil_div(K, kBlockSize), 65535 * 64);
  const int64_t splits = choose_splits(column_blocks, R, 64, target);
  const auto grid_x = static_cast<unsigned>(column_blocks);
  if (splits == 1) {
    reduce_columns_kernel<T, Acc, T><<<dim3(grid_x, 1), kBlockSize, 0, stream.handle>>>(red, in, K, R, R, out, R, true);
    LOOM_CUDA_CHECK_LAUNCH("reduction (columns)");
    return;
  }
  const int64_t chunk = ceil_div(R, splits);
  Tensor partial = empty({splits, K}, TensorOptions(device_dtype<Acc>()).device(Device(DeviceType::CUDA, device)));
  Acc* partial_ptr = static_cast<Acc*>(partial.raw_data());
  reduce_columns_kernel<T, Acc, Acc><<<dim3(grid_x, static_cast<unsigned>(splits)), kBlockSize, 0, stream.handle>>>(
      red, in, K, R, chunk, partial_ptr, R, false);
  LOOM_CUDA_CHECK_LAUNCH("reduction (columns, stage 1)");
  reduce_columns_kernel<Acc, Acc, T><<<dim3(grid_x, 1), kBlockSize, 0, stream.handle>>>(red, partial_ptr, K, splits,
                                                                                      splits, out, R, true);
  LOOM_CUDA_CHECK_LAUNCH("reduction (columns, stage 2)");
}

// `in` viewed with `order` (a permutation of its dims), packed contiguous if needed.
Tensor permuted_contiguous(const Tensor& in, const Shape& order) {
  return contiguous_on_device(in.detach().permute(order));
}

void reduce_cuda(ReduceOp op, const Tensor& in, const std::vector<int64_t>& dims, Tensor& out) {
  const int device = in.device().index;
  DeviceGuard guard(device);
  if (in.numel() == 0) {  // as the CPU: sum of nothing is 0, mean is nan, max errors
    LOOM_CHECK(op == ReduceOp::Sum || op == ReduceOp::Mean, "max/min of an empty tensor is undefined");
    fill_kernel(out.device())(out, op == ReduceOp::Sum ? 0.0 : std::numeric_limits<double>::quiet_NaN());
    return;
  }
  const size_t ndim = in.shape().size();
  std::vector<bool> reduced(ndim, false);
  for (int64_t d : dims) reduced[static_cast<size_t>(d)] = true;
  Shape kept_first, reduced_last;
  for (size_t d = 0; d < ndim; ++d) (reduced[d] ? reduced_last : kept_first).push_back(static_cast<int64_t>(d));
  int64_t R = 1;
  for (int64_t d : reduced_last) R *= in.shape()[static_cast<size_t>(d)];
  const int64_t K = in.numel() / R;

  Shape outer_order = reduced_last;
  outer_order.insert(outer_order.end(), kept_first.begin(), kept_first.end());
  const bool columns = in.detach().permute(outer_order).is_contiguous() && K > 1;
  Shape inner_order = kept_first;
  inner_order.insert(inner_order.end(), reduced_last.begin(), reduced_last.end());
  Tensor source = columns ? in : permuted_contiguous(in, inner_order);
  Tensor result = out.is_contiguous() ? out : empty(out.shape(), TensorOptions(out.dtype()).device(out.device()));
  const Stream stream = current_stream(device);

  dispatch_types(TypeList<float, double, int64_t, __half, __nv_bfloat16>{}, in.dtype(), "reduction", [&]<typename T>() {
    const T* src = static_cast<const T*>(source.raw_data());
    T* dst = static_cast<T*>(result.raw_data());
    if (columns) {
      reduce_columns<T>(op, src, K, R, dst, device, stream);
    } else {
      reduce_rows<T>(op, src, K, R, dst, device, stream);
    }
  });
  if (!result.is_same(out)) copy_on_device(result, out);
}

// ---- max / min along one dim ------------------------------------------------------------

// A candidate extreme: value and index in its row (-1: none yet).
template <typename T>
struct ArgBest {
  T value;
  int64_t index;
};

// Mirrors the CPU's sequential scan: the first extreme wins ties, and a NaN is the
// extreme (the first NaN, as PyTorch).
template <typename T>
__device__ bool better(const ArgBest<T>& a, const ArgBest<T>& b, bool is_max) {
  if (a.index < 0) return false;
  if (b.index < 0) return true;
  const auto x = widen(a.value), y = widen(b.value);
  const bool a_nan = x != x, b_nan = y != y;
  if (a_nan || b_nan) return a_nan && (!b_nan || a.index < b.index);
  if (x == y) return a.index < b.index;
  return is_max ? x > y : x < y;
}

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    arg_extreme_kernel(bool is_max, const T* in, int64_t K, int64_t size, T* values, int64_t* indices) {
  __shared__ ArgBest<T> warp_best[kBlockSize / 32];
  for (int64_t row = blockIdx.x; row < K; row += gridDim.x) {
    const T* p = in + row * size;
    ArgBest<T> best{T(), -1};
    for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
      const ArgBest<T> candidate{p[i], i};
      if (better(candidate, best, is_max)) best = candidate;
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      ArgBest<T> other{__shfl_down_sync(0xffffffffu, best.value, offset), __shfl_down_sync(0xffffffffu, best.index, offset)};
      if (better(other, best, is_max)) best = other;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
        if (better(warp_best[w], best, is_max)) best = warp_best[w];
      values[row] = best.value;
      indices[row] = best.index;
    }
    __syncthreads();
  }
}

void max_min_dim_cuda(bool is_max, const Tensor& in, int64_t dim, Tensor& values, Tensor& indices) {
  const int64_t size = in.shape()[static_cast<size_t>(dim)];
  LOOM_CHECK(size > 0, is_max ? "max" : "min", "(): cannot reduce over an empty dimension ", dim);
  const int device = in.device().index;
  DeviceGuard guard(device);
  Shape order;  // `dim` last: each output scans one contiguous run
  for (int64_t d = 0; d < in.dim(); ++d)
    if (d != dim) order.push_back(d);
  order.push_back(dim);
  Tensor packed = permuted_contiguous(in, order);
  const int64_t K = in.numel() / size;
  if (K == 0) return;
  Tensor vals = values.is_contiguous() ? values : empty(values.shape(), TensorOptions(values.dtype()).device(values.device()));
  Tensor idx = indices.is_contiguous() ? indices : empty(indices.shape(), TensorOptions(kInt64).device(indices.device()));
  const Stream stream = current_stream(device);
  // 16-bit too: argmax of autocast's fp16/bf16 logits (the trainer's accuracy).
  dispatch_types(TypeList<float, double, int64_t, __half, __nv_bfloat16>{}, in.dtype(), is_max ? "max" : "min",
                 [&]<typename T>() {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(K, 65535 * 64));
    arg_extreme_kernel<T><<<blocks, kBlockSize, 0, stream.handle>>>(is_max, static_cast<const T*>(packed.raw_data()), K,
                                                                    size, static_cast<T*>(vals.raw_data()),
                                                                    static_cast<int64_t*>(idx.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH(is_max ? "max(dim)" : "min(dim)");
  });
  if (!vals.is_same(values)) copy_on_device(vals, values);
  if (!idx.is_same(indices)) copy_on_device(idx, indices);
}

}  // namespace

LOOM_REGISTER_KERNEL(reduce_kernel, DeviceType::CUDA, reduce_cuda);
LOOM_REGISTER_KERNEL(max_min_dim_kernel, DeviceType::CUDA, max_min_dim_cuda);

}  // namespace loom::cuda
