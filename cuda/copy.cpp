// copy_kernel for CUDA: every copy that touches a GPU (core/copy.cpp routes them here).
//
//   host -> device    bytes cross in the source dtype from contiguous host memory, then
//                     convert / scatter into dst's strides on the device
//   device -> host    convert / pack on the device into dst's dtype, then bytes cross
//   device -> device  same device: copy_on_device; other device: see Note [Peer copies]
//
// Note [non_blocking copies]
// As PyTorch's Tensor.copy_(src, non_blocking): with non_blocking=false the copy is
// complete when copy_ returns (the stream is synchronised), so the host may read a
// device->host result at once. With non_blocking=true the copy is only queued on the
// current stream; host memory involved must stay untouched until that stream has
// passed the copy (an Event, or stream.synchronize()). That only makes a difference
// with pinned host memory: the driver copies pageable memory synchronously anyway. A
// pinned block is kept from reuse until the copy has run (Note [Pinned block reuse]).
// Device-to-device copies never block the host.
#include <cuda_runtime_api.h>  // defines: cudaMemcpyAsync, cudaMemcpyPeerAsync, cudaDeviceEnablePeerAccess

#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#include "core/factory.h"  // defines: empty
#include "core/kernels.h"
#include "cuda/check.h"           // defines: LOOM_CUDA_CHECK
#include "cuda/copy.h"            // defines: copy_on_device
#include "cuda/device.h"          // defines: DeviceGuard, current_stream, Event
#include "cuda/host_allocator.h"  // defines: is_pinned, record_pinned_use

namespace loom::cuda {
namespace {

// A contiguous host tensor with src's values and dtype (src itself if it already is).
Tensor contiguous_on_host(const Tensor& src) {
  if (src.is_contiguous()) return src;
  Tensor host = empty(src.shape(), TensorOptions(src.dtype()));
  copy_kernel(Device())(src, host, false);
  return host;
}

void copy_host_to_device(const Tensor& src, Tensor& dst, bool non_blocking) {
  const int device = dst.device().index;
  DeviceGuard guard(device);
  const Stream stream = current_stream(device);
  Tensor host = contiguous_on_host(src);
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype();
  // A temporary freed at the end of this function returns to this stream's free blocks;
  // the conversion queued after the transfer is done with it first (Note [Allocator streams]).
  Tensor staging = direct ? dst : empty(src.shape(), TensorOptions(src.dtype()).device(dst.device()));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(staging.raw_data(), host.raw_data(), host.nbytes(), cudaMemcpyHostToDevice, stream.handle),
                  "copying ", host.nbytes(), " bytes from ", src.device(), " to ", dst.device());
  if (!direct) copy_on_device(staging, dst);
  if (non_blocking) {
    record_pinned_use(host.raw_data(), stream);  // See Note [non_blocking copies]
  } else {
    stream.synchronize();
  }
}

void copy_device_to_host(const Tensor& src, Tensor& dst, bool non_blocking) {
  const int device = src.device().index;
  DeviceGuard guard(device);
  const Stream stream = current_stream(device);
  Tensor packed = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    packed = empty(src.shape(), TensorOptions(dst.dtype()).device(src.device()));
    copy_on_device(src, packed);
  }
  Tensor host = dst.is_contiguous() ? dst : empty(dst.shape(), TensorOptions(dst.dtype()));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host.raw_data(), packed.raw_data(), packed.nbytes(), cudaMemcpyDeviceToHost, stream.handle),
                  "copying ", packed.nbytes(), " bytes from ", src.device(), " to ", dst.device());
  if (!host.is_same(dst)) {
    // dst's strides are laid out on the host, which needs the bytes now: non_blocking
    // cannot be honoured for a non-contiguous destination.
    stream.synchronize();
    copy_kernel(Device())(host, dst, false);
  } else if (non_blocking) {
    record_pinned_use(host.raw_data(), stream);
  } else {
    stream.synchronize();
  }
}

// Lets `from` read and write `to`'s memory directly (NVLink / PCIe peer-to-peer), once
// per pair. Where the hardware cannot, cudaMemcpyPeerAsync stages through the host by
// itself, so a failure here only costs speed.
void enable_peer_access(int from, int to) {
  static std::mutex mutex;
  static std::set<std::pair<int, int>> tried;
  std::lock_guard<std::mutex> lock(mutex);
  if (!tried.insert({from, to}).second) return;
  int can_access = 0;
  if (cudaDeviceCanAccessPeer(&can_access, from, to) != cudaSuccess || !can_access) {
    (void)cudaGetLastError();
    return;
  }
  DeviceGuard guard(from);
  cudaError_t error = cudaDeviceEnablePeerAccess(to, 0);
  if (error != cudaSuccess && error != cudaErrorPeerAccessAlreadyEnabled)
    LOOM_CUDA_CHECK(error, "enabling peer access from cuda:", from, " to cuda:", to);
  (void)cudaGetLastError();
}

// Note [Peer copies]
// A copy from cuda:a to cuda:b runs on a's current stream (as PyTorch's), ordered on
// both sides with events: it starts after the work queued so far on b's current stream
// (which may still be using dst), and b's current stream continues only after it.
// Neither the host nor any other stream waits.
void copy_between_devices(const Tensor& src, Tensor& dst) {
  const int from = src.device().index, to = dst.device().index;
  Tensor packed = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    packed = empty(src.shape(), TensorOptions(dst.dtype()).device(src.device()));
    copy_on_device(src, packed);
  }
  Tensor landing = dst.is_contiguous() ? dst : empty(dst.shape(), TensorOptions(dst.dtype()).device(dst.device()));
  const Stream src_stream = current_stream(from), dst_stream = current_stream(to);
  enable_peer_access(from, to);

  Event dst_ready;
  dst_ready.record(dst_stream);
  dst_ready.wait(src_stream);
  {
    DeviceGuard guard(from);
    LOOM_CUDA_CHECK(cudaMemcpyPeerAsync(landing.raw_data(), to, packed.raw_data(), from, packed.nbytes(), src_stream.handle),
                    "copying ", packed.nbytes(), " bytes from cuda:", from, " to cuda:", to);
  }
  Event copied;
  copied.record(src_stream);
  copied.wait(dst_stream);
  if (!landing.is_same(dst)) copy_on_device(landing, dst);  // on dst_stream, after `copied`
}

void copy_cuda(const Tensor& src, Tensor& dst, bool non_blocking) {
  LOOM_CHECK(src.shape() == dst.shape(), "copy: destination shape ", dst.shape(), " does not match source shape ",
             src.shape());
  if (dst.numel() == 0) return;
  const bool from_gpu = src.device().is_cuda(), to_gpu = dst.device().is_cuda();
  if (from_gpu && to_gpu) {
    if (src.device() == dst.device()) return copy_on_device(src, dst);
    return copy_between_devices(src, dst);
  }
  if (to_gpu) return copy_host_to_device(src, dst, non_blocking);
  LOOM_CHECK(from_gpu, "the CUDA copy kernel got a copy between two CPU devices (", src.device(), " -> ", dst.device(), ")");
  copy_device_to_host(src, dst, non_blocking);
}

}  // namespace

LOOM_REGISTER_KERNEL(copy_kernel, DeviceType::CUDA, copy_cuda);

Tensor copy_to_device_async(const Tensor& src, Device device) {
  check_device(device);
  LOOM_CHECK(src.device().is_cpu(), "copy_to_device_async: expected a CPU tensor, got one on ", src.device());
  const Tensor host = contiguous_on_host(src);
  Tensor dst = empty(src.shape(), TensorOptions(src.dtype()).device(device));
  const size_t nbytes = host.nbytes();
  if (nbytes == 0) return dst;
  DeviceGuard guard(device.index);
  const Stream stream = current_stream(device.index);
  Allocator& pinned = pinned_host_allocator();
  void* block = pinned.allocate(nbytes, Device());
  std::memcpy(block, host.raw_data(), nbytes);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), block, nbytes, cudaMemcpyHostToDevice, stream.handle),
                  "copying ", nbytes, " bytes from pinned host memory to ", device);
  // Freed now, handed out again only after the DMA: Note [Pinned block reuse].
  record_pinned_use(block, stream);
  pinned.deallocate(block, nbytes, Device());
  return dst;
}

}  // namespace loom::cuda
