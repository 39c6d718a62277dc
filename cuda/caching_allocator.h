// The CUDA caching allocator: device memory for tensors without a cudaMalloc/cudaFree
// per op, as PyTorch's CUDACachingAllocator. Public header (no CUDA includes).
//
// It is get_allocator(DeviceType::CUDA), so loom::memory_stats(Device("cuda:0")) and
// loom::empty_cache(DeviceType::CUDA) are torch.cuda.memory_stats / empty_cache.
//
// Note [Caching allocator on CUDA]
// cudaMalloc and cudaFree are slow (cudaFree synchronises the whole device), so freed
// blocks are kept and handed out again:
// - Sizes round up to 512 B. Requests up to 1 MiB come from the small pool, carved out
//   of 2 MiB segments; larger ones from the large pool: requests under 10 MiB share
//   20 MiB segments, bigger ones get a segment of their size rounded to 2 MiB.
// - A free block is found best-fit (smallest that fits); a block bigger than needed is
//   split and the rest stays cached (small pool: if at least 512 B remain; large pool:
//   if more than 1 MiB remains). Freed neighbours within a segment merge again.
// - Steady-state training therefore does no cudaMalloc at all: stats().system_allocations
//   stops growing after the first iteration.
// - On cudaMalloc failure every cached, fully free segment of that device is released
//   and the cudaMalloc retried once; a second failure is a loom::Error naming the
//   requested size, what tensors hold and what the cache reserves.
// - empty_cache() returns fully free segments to the driver (for another library or
//   process); it never invalidates memory a tensor holds.
//
// Note [Allocator streams]
// A block is tied to the stream that was current when it was allocated. When a tensor
// dies, its block may still be in use by kernels queued on that stream; handing it to
// the *same* stream's next allocation is safe without any synchronisation, because that
// stream runs its work in order. Handing it to another stream would not be: so each
// (device, stream) has its own free blocks. If a tensor is used on a second stream
// (a communication stream, a side copy), call record_stream(tensor, that_stream): when
// the tensor dies, its block is reused only after that stream has passed the point of
// the call to free, which the allocator checks with an event, never by blocking.
//
// Note [Lazy CUDA initialisation]
// The allocator object is installed with set_allocator at load time, on every machine,
// but it touches the driver only on the first allocation, after check_device() has
// confirmed the GPU exists. On a machine without a GPU, creating a tensor on cuda:0 is
// therefore an ordinary loom::Error ("no CUDA device is available ..."), not a crash at
// startup and not a confusing "no allocator".
#pragma once

#include "core/allocator.h"  // defines: loom::Allocator, AllocatorStats
#include "core/tensor.h"
#include "cuda/device.h"     // defines: loom::cuda::Stream

namespace loom::cuda {

Allocator& caching_allocator();

// See Note [Allocator streams]: `tensor`'s memory is also used by work on `stream`.
void record_stream(const Tensor& tensor, Stream stream);

}  // namespace loom::cuda
