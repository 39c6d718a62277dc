// CUDA indexing kernels: gather, scatter_add, index_select, index_add -- the GPU twins
// of core/cpu/index.cpp, built on the same single loop (Note [Index kernels as one loop]):
//
//   gather:       out[p] = in[base(p) + index[p] * in.stride(dim)]
//   scatter_add:  out[base(p) + index[p] * out.stride(dim)] += src[p]
//
// over the positions p of index's shape, with base(p) = p's offset in the indexed tensor
// with its `dim` coordinate taken as 0. index_select / index_add are the same loop with
// the 1-D index laid along `dim` (stride 0 elsewhere). One thread per position; the
// three operands' offsets come from a StridedIndexer<3> (cuda/loops.cuh), whose dims are
// collapsed exactly as on the CPU.
//
// scatter_add / index_add add with atomicAdd: positions with the same index on `dim`
// hit the same element from different threads. The CPU avoids atomics by never splitting
// `dim` across threads (Note [Scatter without races]); a GPU has far more threads than
// any other dim has elements, so here the order of the additions -- and for floats the
// last bits of the sum -- may differ from run to run (PyTorch's CUDA index_add_ and
// scatter_add_ are non-deterministic for the same reason). Integer sums are exact.
//
// Out-of-range indices: Note [Index validation on the GPU] (cuda/kernel_utils.cuh).
#include "core/deterministic.h"  // defines: alert_not_deterministic (atomicAdd)
#include "core/index_layout.h"  // defines: without_dim, along_dim, check_index_*
#include "core/kernels.h"
#include "cuda/kernel_utils.cuh"  // defines: BadIndexFlag, report_bad_index
#include "cuda/loops.cuh"         // defines: StridedIndexer, make_indexer, dispatch_types

namespace loom::cuda {
namespace {

// The dtypes atomicAdd serves (16-bit floats natively on sm_70+ / sm_80+).
using AddTypes = TypeList<float, double, int64_t, int32_t, __half, __nv_bfloat16>;

template <typename T>
__device__ inline void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(value));
  } else {
    atomicAdd(address, value);
  }
}

// The launch both ops share: operand 0 is out (gather) or src (scatter), 1 the index,
// 2 the indexed tensor with stride[dim] = 0.
struct IndexLoop {
  int64_t n;
  StridedIndexer<3> indexer;
  int64_t step;  // the indexed tensor's stride along dim
  int64_t size;  // its size along dim: valid indices are 0..size-1
};

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    gather_cuda_kernel(IndexLoop loop, const T* in, const int64_t* index, T* out, int64_t* bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < loop.n; p += stride) {
    int64_t at[3];
    loop.indexer.offsets(p, at);
    const int64_t i = index[at[1]];
    if (i < 0 || i >= loop.size) {
      report_bad_index(bad, i);
      continue;
    }
    out[at[0]] = in[at[2] + i * loop.step];
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    scatter_add_cuda_kernel(IndexLoop loop, const T* src, const int64_t* index, T* out, int64_t* bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < loop.n; p += stride) {
    int64_t at[3];
    loop.indexer.offsets(p, at);
    const int64_t i = index[at[1]];
    if (i < 0 || i >= loop.size) {
      report_bad_index(bad, i);
      continue;
    }
    atomic_add(out + at[2] + i * loop.step, src[at[0]]);
  }
}

// Runs `launch(loop, bad_flag_ptr, grid, stream)` over index's positions and turns a
// recorded bad index into the CPU kernels' error.
template <typename Launch>
void run_index_loop(const char* op, const Tensor& positions_of, const Shape& operand0_strides, const Tensor& index,
                    const Shape& indexed_strides, int64_t dim, int64_t step, int64_t size, int device, Launch launch) {
  check_index_dtype(op, index);
  const int64_t n = positions_of.numel();
  if (n == 0) return;
  DeviceGuard guard(device);
  IndexLoop loop{n, {}, step, size};
  const Shape without = without_dim(indexed_strides, dim);
  loop.indexer = make_indexer<3>(index.shape(), {&operand0_strides, &index.strides(), &without}, op);
  BadIndexFlag bad(device);
  launch(loop, bad.ptr, grid_size(n, device), current_stream(device).handle);
  LOOM_CUDA_CHECK_LAUNCH(op);
  const auto [seen, value] = bad.read(device);
  check_index_in_bounds(op, seen, value, dim, size);
}

void gather_impl(const char* op, const Tensor& in, int64_t dim, const Tensor& index, Tensor& out) {
  dispatch_types(AllTypes{}, in.dtype(), op, [&]<typename T>() {
    run_index_loop(op, index, out.strides(), index, in.strides(), dim, in.stride(dim), in.size(dim), out.device().index,
                   [&](const IndexLoop& loop, int64_t* bad, unsigned grid, cudaStream_t stream) {
                     gather_cuda_kernel<T><<<grid, kBlockSize, 0, stream>>>(
                         loop, static_cast<const T*>(in.raw_data()), static_cast<const int64_t*>(index.raw_data()),
                         static_cast<T*>(out.raw_data()), bad);
                   });
  });
}

void scatter_add_impl(const char* op, Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  LOOM_CHECK(out.dtype() != kBool, op, ": adding bool tensors is not supported; convert with .to(kInt64) first");
  if (is_floating(out.dtype()))  // atomicAdd's order: the last bits of a float sum vary (above)
    alert_not_deterministic(std::string(op) + " on CUDA (atomicAdd)", "run it on the CPU, whose loop adds in order");
  dispatch_types(AddTypes{}, out.dtype(), op, [&]<typename T>() {
    run_index_loop(op, index, src.strides(), index, out.strides(), dim, out.stride(dim), out.size(dim),
                   out.device().index, [&](const IndexLoop& loop, int64_t* bad, unsigned grid, cudaStream_t stream) {
                     scatter_add_cuda_kernel<T><<<grid, kBlockSize, 0, stream>>>(
                         loop, static_cast<const T*>(src.raw_data()), static_cast<const int64_t*>(index.raw_data()),
                         static_cast<T*>(out.raw_data()), bad);
                   });
  });
}

void gather_cuda(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out) {
  gather_impl("gather", in, dim, index, out);
}

void scatter_add_cuda(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  scatter_add_impl("scatter_add", out, dim, index, src);
}

void index_select_cuda(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out) {
  gather_impl("index_select", in, dim, along_dim(index, dim, out.shape()), out);
}

void index_add_cuda(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  scatter_add_impl("index_add", out, dim, along_dim(index, dim, src.shape()), src);
}

}  // namespace

LOOM_REGISTER_KERNEL(index_select_kernel, DeviceType::CUDA, index_select_cuda);
LOOM_REGISTER_KERNEL(index_add_kernel, DeviceType::CUDA, index_add_cuda);
LOOM_REGISTER_KERNEL(gather_kernel, DeviceType::CUDA, gather_cuda);
LOOM_REGISTER_KERNEL(scatter_add_kernel, DeviceType::CUDA, scatter_add_cuda);

}  // namespace loom::cuda
