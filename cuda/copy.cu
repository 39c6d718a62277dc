// The on-device converting copy; see cuda/copy.h.
//
// One kernel per *source* dtype, with the destination dtype a runtime switch inside
// it: 8 instantiations instead of the 64 a (source, destination) template would need
// (see Note [GPU elementwise loop] for why the switch costs nothing).
#include "cuda/copy.h"

#include "cuda/loops.cuh"  // defines: StridedIndexer, dispatch_types, narrow, grid_size

namespace loom::cuda {
namespace {

template <typename Dst, typename Src>
__device__ __forceinline__ void store(void* dst, int64_t offset, Src value) {
  static_cast<Dst*>(dst)[offset] = narrow<Dst>(value);
}

template <typename Src>
__global__ void __launch_bounds__(kBlockSize)
    convert_kernel(int64_t n, bool contiguous, StridedIndexer<2> indexer, const Src* src, void* dst, DType dst_dtype) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t offset[2] = {i, i};
    if (!contiguous) indexer.offsets(i, offset);
    const Src value = src[offset[1]];
    switch (dst_dtype) {
      case DType::Float32: store<float>(dst, offset[0], value); break;
      case DType::Float64: store<double>(dst, offset[0], value); break;
      case DType::Int64: store<int64_t>(dst, offset[0], value); break;
      case DType::Int32: store<int32_t>(dst, offset[0], value); break;
      case DType::UInt8: store<uint8_t>(dst, offset[0], value); break;
      case DType::Bool: store<bool>(dst, offset[0], value); break;
      case DType::Float16: store<__half>(dst, offset[0], value); break;
      case DType::BFloat16: store<__nv_bfloat16>(dst, offset[0], value); break;
    }
  }
}

}  // namespace

void copy_on_device(const Tensor& src, Tensor& dst) {
  LOOM_CHECK(src.device() == dst.device() && src.device().is_cuda(), "copy_on_device: expected both tensors on one CUDA device, got ",
             src.device(), " -> ", dst.device());
  LOOM_CHECK(src.shape() == dst.shape(), "copy: destination shape ", dst.shape(), " does not match source shape ", src.shape());
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const Stream stream = current_stream(device);
  const bool contiguous = src.is_contiguous() && dst.is_contiguous();
  if (contiguous && src.dtype() == dst.dtype()) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream.handle),
                    "copying ", dst.nbytes(), " bytes within ", dst.device());
    return;
  }
  StridedIndexer<2> indexer;
  if (!contiguous) indexer = make_indexer<2>(dst.shape(), {&dst.strides(), &src.strides()}, "copy");
  dispatch_types(AllTypes{}, src.dtype(), "copy", [&]<typename Src>() {
    convert_kernel<Src><<<grid_size(n, device), kBlockSize, 0, stream.handle>>>(
        n, contiguous, indexer, static_cast<const Src*>(src.raw_data()), dst.raw_data(), dst.dtype());
    LOOM_CUDA_CHECK_LAUNCH("copy");
  });
}

Tensor contiguous_on_device(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor packed = empty(t.shape(), TensorOptions(t.dtype()).device(t.device()));
  copy_on_device(t, packed);
  return packed;
}

}  // namespace loom::cuda
