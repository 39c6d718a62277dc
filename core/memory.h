// Device memory: a budget per device, PyTorch's out-of-memory report, and its statistics,
// as torch.cuda's memory functions, for CPU virtual devices (cpu:N) and CUDA alike.
//
//   loom::set_device_memory_limit(1536LL << 20, Device("cpu:1"));   // 1.5 GiB for cpu:1
//   loom::set_per_process_memory_fraction(0.5, Device("cuda:0"));   // half the GPU
//   ... train ...
//   loom::max_memory_allocated(Device("cpu:1"));                     // the step's peak
//   std::cout << loom::memory_summary(Device("cpu:1"));
//   try { ... } catch (const loom::OutOfMemoryError& e) { ... }      // e.what(): the report
//
// Note [Device memory budget]
// A GPU has a fixed memory; loom's virtual CPU devices share the host's, so without a
// budget a model that would not fit one GPU trains anyway, and a learner never sees why
// sharding (FSDP) or pipelining exists. The budget is PyTorch's: a cap on the bytes the
// caching allocator *reserves* for the device in this process (tensors' blocks plus its
// cache), set as a fraction of the device's capacity (set_per_process_memory_fraction) or
// in bytes (set_device_memory_limit, loom's own, for the `--device-memory-limit 1.5GiB`
// flag). An allocation that would take the device past it, or that the system refuses,
// first returns the device's cached blocks and retries once (num_alloc_retries counts
// these); if that is not enough it raises OutOfMemoryError (num_ooms counts those) with
// PyTorch's report: what was requested, the device's capacity and what is free, the
// limit, and what is allocated against what is reserved but unallocated.
//
// Statistics are per device, as torch.cuda's: each CPU virtual device has its own cache
// and its own counts (Note [Caching allocator], core/allocator.h), so a pipeline stage's
// or a rank's peak is its own device's. Device memory the allocator does not hand out
// counts too, through reserve_external_memory: the shared-memory blocks of symmetric
// tensors (DDP's buckets, FSDP's shards) and FSDP's gathered parameters on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/allocator.h"  // defines: AllocatorStats, memory_stats, empty_cache
#include "core/device.h"     // defines: Device
#include "core/error.h"      // defines: Error

namespace loom {

// torch.OutOfMemoryError: raised by an allocation past the device's budget or memory.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// set_device_memory_limit's value for "no limit" (the default).
constexpr int64_t kNoMemoryLimit = -1;

// torch.cuda.set_per_process_memory_fraction: at most fraction * capacity reserved bytes
// on `device`, fraction in [0, 1].
void set_per_process_memory_fraction(double fraction, Device device = Device());
// The same cap in bytes (>= 0), or kNoMemoryLimit to lift it.
void set_device_memory_limit(int64_t bytes, Device device = Device());
// The cap in bytes, or kNoMemoryLimit.
int64_t device_memory_limit(Device device = Device());

// The device's total memory (the host's physical memory for CPU devices, which share it)
// and what is free now, as torch.cuda.mem_get_info's (free, total).
int64_t device_memory_capacity(Device device = Device());
int64_t device_memory_free(Device device = Device());

// As torch.cuda's: bytes in tensors' blocks now and at most since the last reset; bytes
// the allocator reserves (blocks in use + cached) now and at most.
int64_t memory_allocated(Device device = Device());
int64_t max_memory_allocated(Device device = Device());
int64_t memory_reserved(Device device = Device());
int64_t max_memory_reserved(Device device = Device());
void reset_peak_memory_stats(Device device = Device());
// torch.cuda.memory_summary: a table of the above, the limit, num_ooms and num_alloc_retries.
std::string memory_summary(Device device = Device());

// Counts `bytes` of memory the caching allocator did not hand out (a shared-memory block:
// Note [Symmetric memory], parallel/comm/communicator.h) in `device`'s allocated and
// reserved bytes and against its budget, until the returned handle is released; keep it
// alive with the memory. Past the budget: OutOfMemoryError, after the cache is freed.
std::shared_ptr<void> reserve_external_memory(int64_t bytes, Device device);

// The process's resident memory now and at its highest so far (Linux's VmRSS and VmHWM in
// /proc/self/status; the peak is getrusage's ru_maxrss): everything the process holds in
// RAM, tensors, the allocators' caches, libraries' buffers and code alike, where the
// statistics above count only the caching allocator's blocks. Both 0 where /proc cannot
// be read.
struct ResidentMemory {
  int64_t current = 0, peak = 0;  // bytes
};
ResidentMemory resident_memory();

// "1.50 GiB", "20.00 MiB", "512 bytes": PyTorch's format_size, used by the report.
std::string format_memory_size(int64_t bytes);
// "1.5GiB", "512MiB", "2GB", "1073741824": bytes, for --device-memory-limit; a loom::Error
// naming the expected forms otherwise. KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024.
int64_t parse_memory_size(const std::string& text);

// The report an allocator raises (allocators call it; exposed for tests): PyTorch's
// "... out of memory. Tried to allocate X. Device D has a total capacity of C of which F is
// free. L allowed; Of the allocated memory A is allocated by loom, and R is reserved by
// loom but unallocated. ..." with `stats` the device's after the retry.
std::string out_of_memory_message(Device device, int64_t requested, const AllocatorStats& stats, int64_t limit);

}  // namespace loom
