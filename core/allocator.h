// Allocator: per-device-type memory source, and the CPU caching allocator.
//
// Note [Caching allocator]
// A training step allocates and frees the same sizes every iteration. Returning large
// blocks to glibc makes it munmap them, and the next step page-faults the same memory
// back in (PyTorch on CPU loses ~20% to this at batch 128). loom's CPU allocator keeps
// freed blocks in size-bucketed free lists and hands them out again, so steady-state
// training does no system allocation at all. empty_cache() returns them to the system.
// The CUDA backend registers its own allocator of the same shape (cuda/).
//
// Which block: the smallest cached one whose size class is at least the request's and
// at most twice it (best fit). A cached block's pages are resident already, so handing
// out a larger one costs nothing, while a fresh block adds to the process's memory; with
// exact classes only, every size a network uses keeps its own peak count of blocks, and
// the cache is the *sum* of those peaks. A ResNet's stages have halving activation
// sizes, so stage 1's blocks now serve stage 2 instead: ResNet18 eval at batch 128
// reserves 356 MiB instead of 462, training at batch 32 344 instead of 374 (bench_train).
// The factor 2 bounds what a smaller tensor wastes of a block; larger factors went
// lower still in eval but made training reach its steady state later, or not at all.
// The steady state holds because a step's requests repeat in the same order, so from a
// free list that already served a whole step without a miss, every later step is served
// alike. A block keeps its class for life; stats count whole blocks.
//
// Each CPU device (cpu, and every virtual cpu:N) has its own free lists and statistics, as
// each GPU has: a block freed on cpu:1 serves cpu:1 again, so a device's reserved bytes
// are its own, and a budget per device (Note [Device memory budget], core/memory.h) caps
// them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace loom {

// One device's, as the fields of torch.cuda.memory_stats.
struct AllocatorStats {
  int64_t allocated_bytes = 0;       // handed out to tensors now (whole blocks)
  int64_t reserved_bytes = 0;        // allocated + cached in free lists
  int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since the last reset
  int64_t peak_reserved_bytes = 0;   // max of reserved_bytes since the last reset
  int64_t system_allocations = 0;    // calls that went to the system (cache misses)
  int64_t num_alloc_retries = 0;     // allocations that freed the cache and tried again
  int64_t num_ooms = 0;              // OutOfMemoryErrors raised
  // Of allocated_bytes, what reserve_external counts (shared-memory blocks: DDP's buckets,
  // FSDP's shards and gathered units), now and when the peak was reached: what a
  // memory estimate calls communication buffers and gathered units.
  int64_t external_bytes = 0;
  int64_t external_bytes_at_peak = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Memory for nbytes on `device`, 64-byte aligned; never null (throws on failure).
  virtual void* allocate(size_t nbytes, Device device) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, Device device) = 0;
  virtual AllocatorStats stats(Device device) const = 0;
  virtual void reset_peak_stats(Device device) = 0;
  virtual void empty_cache() = 0;
  // The cap on `device`'s reserved bytes, kNoMemoryLimit (-1) for none (core/memory.h).
  // An allocator without budgets refuses a cap.
  virtual void set_memory_limit(Device device, int64_t bytes);
  virtual int64_t memory_limit(Device device) const;
  // The device's total memory and what is free now (torch.cuda.mem_get_info); the
  // default is the host's, which CPU devices share.
  virtual int64_t capacity(Device device) const;
  virtual int64_t free_memory(Device device) const;
  // Memory the device holds that this allocator did not hand out (a shared-memory
  // segment's block), counted as allocated and reserved and against the budget until
  // released; past the budget, as allocate (core/memory.h: reserve_external_memory).
  // An allocator without budgets ignores it.
  virtual void reserve_external(Device device, int64_t bytes);
  virtual void release_external(Device device, int64_t bytes);
};

// The allocator of a device type; the CUDA backend installs its allocator at load time.
Allocator* get_allocator(DeviceType type);
void set_allocator(DeviceType type, Allocator* allocator);

// Convenience wrappers, as torch.cuda.memory_allocated() etc.
AllocatorStats memory_stats(Device device);
void empty_cache(DeviceType type);

}  // namespace loom
