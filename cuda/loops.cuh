// gpu_map: the elementwise loop every CUDA pointwise kernel is written with, the GPU
// twin of cpu_map (core/cpu/loops.h). Internal to cuda/ .cu files.
//
//   gpu_map<float>(out, AddFn<float>{alpha}, a, b);  // out[i] = f(a[i], b[i])
//
// Note [GPU elementwise loop]
// - Operands are already broadcast to out's shape (core/kernels.h). Dims are collapsed
//   exactly as on the CPU (collapse_dims), and what remains -- at most kMaxDims dims --
//   travels to the kernel by value in a StridedIndexer (a mini TensorIterator).
// - One grid-stride kernel per (output type, input types, functor): when every operand
//   is contiguous it indexes them directly, otherwise it turns the linear index into
//   per-operand offsets. The branch is uniform across the grid, so one instantiation
//   serves both layouts (half the compile time of two kernels).
// - Ops are functors whose operator() switches on a runtime op code (UnaryOp, ...):
//   again one instantiation per dtype instead of one per (dtype, op). The switch is
//   the same for every thread, so it costs no divergence; these kernels are
//   memory-bound anyway.
// - 16-bit floats (__half, __nv_bfloat16: the same bits as loom::Half/BFloat16) are
//   computed in float: load with widen(), store with narrow<T>().
// - Each kernel runs on the current stream of the output's device
//   (Note [Streams in loom]).
#pragma once

#include <cuda_bf16.h>  // defines: __nv_bfloat16
#include <cuda_fp16.h>  // defines: __half
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "core/cpu/loops.h"  // defines: cpu::collapse_dims (layout logic shared with the CPU loop)
#include "core/tensor.h"
#include "cuda/check.h"   // defines: LOOM_CUDA_CHECK_LAUNCH
#include "cuda/device.h"  // defines: current_stream, DeviceGuard, multiprocessor_count

namespace loom::cuda {

// ---- dtypes ---------------------------------------------------------------------------

static_assert(sizeof(__half) == sizeof(Half) && sizeof(__nv_bfloat16) == sizeof(BFloat16));

template <typename T> constexpr DType device_dtype();
template <> constexpr DType device_dtype<float>() { return kFloat32; }
template <> constexpr DType device_dtype<double>() { return kFloat64; }
template <> constexpr DType device_dtype<int64_t>() { return kInt64; }
template <> constexpr DType device_dtype<int32_t>() { return kInt32; }
template <> constexpr DType device_dtype<uint8_t>() { return kUInt8; }
template <> constexpr DType device_dtype<bool>() { return kBool; }
template <> constexpr DType device_dtype<__half>() { return kFloat16; }
template <> constexpr DType device_dtype<__nv_bfloat16>() { return kBFloat16; }

template <typename... Ts> struct TypeList {};
using FloatTypes = TypeList<float, double>;
using FloatAndHalfTypes = TypeList<float, double, __half, __nv_bfloat16>;
using NumberTypes = TypeList<float, double, int64_t>;
using AllTypes = TypeList<float, double, int64_t, int32_t, uint8_t, bool, __half, __nv_bfloat16>;

// Calls body.template operator()<T>() with the device type T of `dtype`, for the types
// in List only: each op instantiates its kernels for exactly the dtypes it lists.
template <typename... Ts, typename F>
void dispatch_types(TypeList<Ts...>, DType dtype, const char* op, F&& body) {
  bool found = ((device_dtype<Ts>() == dtype ? (body.template operator()<Ts>(), true) : false) || ...);
  if (!found) {
    std::string supported;
    ((supported += std::string(supported.empty() ? "" : ", ") + dtype_name(device_dtype<Ts>())), ...);
    LOOM_FAIL(op, " on CUDA: dtype ", dtype, " is not supported (supported: ", supported, ")");
  }
}

// Arithmetic type of a storage type: 16-bit floats compute in float.
template <typename T> struct Compute { using type = T; };
template <> struct Compute<__half> { using type = float; };
template <> struct Compute<__nv_bfloat16> { using type = float; };
template <typename T> using compute_t = typename Compute<T>::type;

template <typename T> __host__ __device__ inline compute_t<T> widen(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return x;
}

// static_cast<T>(x) for every pair of storage types, 16-bit floats through float (as
// core/cpu/elementwise.cpp's copy: double -> float -> half). A float into an integer
// type narrower than 32 bits goes through int32, as the CPU's conversion does (x86
// converts to 32 bits, then keeps the low bits: -50.3 -> uint8 206); PTX's direct
// conversion would saturate to 0 instead.
template <typename T, typename S> __host__ __device__ inline T narrow(S x) {
  if constexpr (std::is_same_v<T, __half>) return __float2half(static_cast<float>(widen(x)));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(static_cast<float>(widen(x)));
  else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && sizeof(T) < 4 &&
                     !std::is_integral_v<S>)
    return static_cast<T>(static_cast<int32_t>(widen(x)));
  else return static_cast<T>(widen(x));
}

// ---- layout ---------------------------------------------------------------------------

constexpr int kMaxDims = 8;

template <int N>
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // in elements

  // The offset of element `linear` (row-major over sizes) in every operand.
  __device__ void offsets(int64_t linear, int64_t (&offset)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) offset[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t index = linear % sizes[d];
      linear /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) offset[k] += index * strides[k][d];
    }
  }
};

template <int N>
StridedIndexer<N> make_indexer(const Shape& shape, const std::array<const Shape*, N>& strides, const char* op) {
  auto layout = cpu::collapse_dims<N>(shape, strides);
  LOOM_CHECK(layout.sizes.size() <= kMaxDims, op, " on CUDA: operands of shape ", shape, " have ", layout.sizes.size(),
             " dims that cannot be merged; at most ", kMaxDims, " are supported (make an operand contiguous() first)");
  StridedIndexer<N> indexer;
  indexer.ndim = static_cast<int>(layout.sizes.size());
  for (int d = 0; d < indexer.ndim; ++d) {
    indexer.sizes[d] = layout.sizes[static_cast<size_t>(d)];
    for (int k = 0; k < N; ++k) indexer.strides[k][d] = layout.strides[static_cast<size_t>(k)][static_cast<size_t>(d)];
  }
  return indexer;
}

// ---- launching --------------------------------------------------------------------------

constexpr int kBlockSize = 256;

// Enough blocks to fill the device a few times over; the grid-stride loop does the rest.
inline unsigned grid_size(int64_t n, int device) {
  const int64_t wanted = (n + kBlockSize - 1) / kBlockSize;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * 16;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(wanted, cap)));
}

template <typename Out, typename... In, typename F, size_t... I>
__device__ __forceinline__ void map_strided_one(int64_t i, const StridedIndexer<1 + sizeof...(In)>& indexer, F& f,
                                                Out* out, std::index_sequence<I...>, const In*... in) {
  int64_t offset[1 + sizeof...(In)];
  indexer.offsets(i, offset);
  out[offset[0]] = f(in[offset[I + 1]]...);
}

template <typename F, typename Out, typename... In>  // (a __global__ pack must come last)
__global__ void __launch_bounds__(kBlockSize)
    map_kernel(int64_t n, bool contiguous, StridedIndexer<1 + sizeof...(In)> indexer, F f, Out* out, const In*... in) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (contiguous) {
    for (; i < n; i += step) out[i] = f(in[i]...);
  } else {
    for (; i < n; i += step) map_strided_one<Out, In...>(i, indexer, f, out, std::index_sequence_for<In...>{}, in...);
  }
}

// out[i] = f(ins[i]...) with Out and In the device storage types of out and ins.
template <typename Out, typename... In, typename F, typename... Tensors>
void gpu_map(Tensor& out, F f, const Tensors&... ins) {
  static_assert(sizeof...(In) == sizeof...(Tensors), "one element type per input tensor");
  constexpr int N = 1 + sizeof...(In);
  const int64_t n = out.numel();
  if (n == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  const bool contiguous = (out.is_contiguous() && ... && ins.is_contiguous());
  StridedIndexer<N> indexer;
  if (!contiguous) indexer = make_indexer<N>(out.shape(), {&out.strides(), &ins.strides()...}, "elementwise op");
  map_kernel<F, Out, In...><<<grid_size(n, device), kBlockSize, 0, current_stream(device).handle>>>(
      n, contiguous, indexer, f, static_cast<Out*>(out.raw_data()), static_cast<const In*>(ins.raw_data())...);
  LOOM_CUDA_CHECK_LAUNCH("elementwise");
}

}  // namespace loom::cuda
