// Allocator: per-device-type memory source, and the CPU caching allocator.
//
// Note [Caching allocator]
// A training step allocates and frees the same sizes every iteration. Returning large
// blocks to the system makes it unmap them, and the next step page-faults the same memory
// back in (PyTorch on CPU loses ~20% to this at batch 128). loom's CPU allocator keeps
// freed memory and hands it out again, so steady-state training does no system
// allocation at all. Its shape is PyTorch's CUDA caching allocator's (Note [Caching
// allocator on CUDA], cuda/caching_allocator.h), on memory mapped from the system:
// - Sizes round up to 512 B. Requests up to 1 MiB come from the small pool, carved out
//   of 2 MiB segments; larger ones from the large pool, where a request nothing cached
//   fits gets a segment of its size rounded up to 2 MiB.
// - The smallest free block that fits is taken (best fit) and split when the rest is
//   worth keeping apart (small pool: at least 512 B; large pool: more than 1 MiB); freed
//   neighbours within a segment merge again. One activation's block thus serves two
//   smaller tensors later in the step, and they give it back whole for the next large
//   one: the cache holds about the step's peak, not the sum over sizes of each size's
//   peak count of blocks (what a cache of whole blocks per size class holds).
// - Memory the workload stopped using goes back to the system: when nothing cached fits
//   a request, the pool's fully free segments (all smaller than the request, or one would
//   have served it) are unmapped, longest idle first, up to the size of the segment about
//   to be mapped. After training at batch 1024, the evaluation at batch 2000 needs larger
//   blocks than the training's, which would otherwise stay cached beside its own. A step
//   that repeats the last one's requests is served from the cache without a miss, so
//   steady-state training never pays for this.
// - Blocks over 256 MiB are *oversize* (PyTorch's max_split_size): never split, and they
//   serve oversize requests only, as their idle segments go back only for another
//   oversize request. Such a request is a whole-batch workspace (oneDNN's Winograd
//   scratchpad: 734 MiB on airbench94's training step) or a data set. Were it carved into
//   the step's smaller tensors, a tensor that outlives the step (an optimizer's state,
//   created in the first step) would pin it, the next step's request would find no block
//   whole, and each such request would map a segment of its own: on airbench94, 740 MiB
//   more resident memory after twelve steps than after one.
// - empty_cache() unmaps every fully free segment; a budget (Note [Device memory budget],
//   core/memory.h) does the same before it raises OutOfMemoryError.
// On the speedrun (docs/speedrun.md) the training step, its convolutions' workspaces
// included, and the evaluation after it are served from the same 2.8 GiB, the 0.7 GiB data
// set included, where whole blocks per size class reserved 4.5 GiB (12 steps).
// The steady state: a step's requests repeat in the same order, so once a step is served
// without a miss the cache is laid out to serve the next alike; misses stop after the
// first steps (stats().system_allocations stays flat). Stats count whole blocks: a
// block's size is its request's, rounded, or the whole free block when too little would
// remain to split off.
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
