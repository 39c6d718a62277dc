// Pinned (page-locked) host memory, cached, as PyTorch's CachingHostAllocator.
// Public header (no CUDA includes).
//
// A host->device copy from pageable memory is staged by the driver through a pinned
// bounce buffer and cannot overlap compute; from pinned memory it is a DMA that runs
// asynchronously on a stream. DataLoader(pin_memory=true) and Tensor::pin_memory()
// (later slices) allocate their host buffers here; cuda/copy.cpp then copies them with
// non_blocking=true. cudaHostAlloc is slower than cudaMalloc, so blocks are cached.
//
// Note [Pinned block reuse]
// After an asynchronous copy out of (or into) a pinned block, the host may drop its
// tensor while the DMA still runs. The copy calls record_pinned_use(ptr, stream); the
// block is handed out again only once an event recorded then has completed.
#pragma once

#include "core/allocator.h"  // defines: loom::Allocator
#include "core/tensor.h"
#include "cuda/device.h"     // defines: loom::cuda::Stream

namespace loom::cuda {

// Sizes round up to a power of two (at least 512 B); the device argument is ignored.
Allocator& pinned_host_allocator();
// True if `ptr` lies inside a block handed out by pinned_host_allocator().
bool is_pinned(const void* ptr);
// See Note [Pinned block reuse]; no-op for memory that is not pinned.
void record_pinned_use(const void* ptr, Stream stream);

// `host` (a CPU tensor in ordinary, pageable memory, e.g. a DataLoader batch) copied to
// `device` without blocking the host: its bytes are first memcpy'd into a cached pinned
// block, which then crosses by DMA on the device's current stream -- the copy
// DataLoader(pin_memory=true) + .to(device, non_blocking=true) makes in PyTorch. The
// result is valid on that stream (Note [Streams in loom]); the host may reuse `host` at
// once. Throws (saying why) without a GPU.
Tensor copy_to_device_async(const Tensor& host, Device device);

}  // namespace loom::cuda
