// Allocator: per-device-type memory source, and the CPU caching allocator.
//
// Note [Caching allocator]
// A training step allocates and frees the same sizes every iteration. Returning large
// blocks to glibc makes it munmap them, and the next step page-faults the same memory
// back in (PyTorch on CPU loses ~20% to this at batch 128). loom's CPU allocator keeps
// freed blocks in size-bucketed free lists and hands them out again, so steady-state
// training does no system allocation at all. empty_cache() returns them to the system.
// The CUDA backend registers its own allocator of the same shape (cuda/).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace loom {

struct AllocatorStats {
  int64_t allocated_bytes = 0;       // handed out to tensors now
  int64_t reserved_bytes = 0;        // allocated + cached in free lists
  int64_t peak_allocated_bytes = 0;  // max of allocated_bytes since the last reset
  int64_t system_allocations = 0;    // calls that went to the system (cache misses)
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
};

// The allocator of a device type; the CUDA backend installs its allocator at load time.
Allocator* get_allocator(DeviceType type);
void set_allocator(DeviceType type, Allocator* allocator);

// Convenience wrappers, as torch.cuda.memory_allocated() etc.
AllocatorStats memory_stats(Device device);
void empty_cache(DeviceType type);

}  // namespace loom
