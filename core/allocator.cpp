#include "core/allocator.h"

#include <unistd.h>  // defines: sysconf, for the host's memory

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/memory.h"  // defines: OutOfMemoryError, out_of_memory_message, kNoMemoryLimit

namespace loom {
namespace {

constexpr size_t kAlignment = 64;  // a cache line, and what AVX-512 loads like
// A request may take a cached block up to this many times its own size class (Note
// [Caching allocator]: which block).
constexpr size_t kMaxOversize = 2;

// Size classes: round up to 64 bytes below 4 KiB, otherwise to 1/8 of the enclosing
// power of two. Worst-case waste is 12.5%, and tensors of nearly equal size (e.g. the
// last, smaller batch of an epoch) share a bucket.
size_t round_size(size_t nbytes) {
  if (nbytes <= 4096) return std::max<size_t>(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
  size_t power = 1;
  while (power < nbytes) power <<= 1;
  size_t step = power / 8;
  return (nbytes + step - 1) / step * step;
}

// See Note [Caching allocator]. One free list per size class and device (each virtual CPU
// device caches its own blocks, as a GPU does). A mutex keeps it thread-safe: DP replicas,
// pipeline stages and DataLoader workers allocate concurrently.
class CachingCpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    const size_t size = round_size(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (void* cached = take_cached(device.index, size)) return cached;
      // A cache miss: the bytes count against the device's budget from here, so that two
      // threads cannot both pass the check.
      check_budget(device, size, nbytes);
      note_reserved(state(device.index), static_cast<int64_t>(size));
    }
    void* ptr = std::aligned_alloc(kAlignment, size);
    if (!ptr) {
      empty_cache();  // one retry with every device's cache returned to the system
      std::lock_guard<std::mutex> lock(mutex_);
      state(device.index).stats.num_alloc_retries += 1;
      ptr = std::aligned_alloc(kAlignment, size);
      if (!ptr) {
        state(device.index).stats.reserved_bytes -= static_cast<int64_t>(size);
        throw_out_of_memory(device, nbytes);
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& d = state(device.index);
    d.stats.system_allocations += 1;
    in_use_.emplace(ptr, Block{size, device.index});
    note_allocated(d, size);
    return ptr;
  }

  void deallocate(void* ptr, size_t, Device) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = in_use_.find(ptr);
    LOOM_CHECK(found != in_use_.end(), "CPU allocator: deallocate of ", ptr, ", which it did not hand out");
    const Block block = found->second;  // the block's own class and device (Storage's device may be re-labelled)
    in_use_.erase(found);
    DeviceState& d = state(block.device);
    d.free[block.size].push_back(ptr);
    d.stats.allocated_bytes -= static_cast<int64_t>(block.size);
  }

  AllocatorStats stats(Device device) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(device.index);
    return it == devices_.end() ? AllocatorStats{} : it->second.stats;
  }

  void reset_peak_stats(Device device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    AllocatorStats& stats = state(device.index).stats;
    stats.peak_allocated_bytes = stats.allocated_bytes;
    stats.external_bytes_at_peak = stats.external_bytes;
    stats.peak_reserved_bytes = stats.reserved_bytes;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : devices_) release_cached(entry.first);
  }

  void set_memory_limit(Device device, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    state(device.index).limit = bytes;
  }

  int64_t memory_limit(Device device) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = devices_.find(device.index);
    return it == devices_.end() ? kNoMemoryLimit : it->second.limit;
  }

  void reserve_external(Device device, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto size = static_cast<size_t>(bytes);
    check_budget(device, size, size);
    DeviceState& d = state(device.index);
    d.stats.external_bytes += bytes;  // before note_allocated, which may record it at a new peak
    note_reserved(d, bytes);
    note_allocated(d, size);
  }

  void release_external(Device device, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& d = state(device.index);
    d.stats.allocated_bytes -= bytes;
    d.stats.reserved_bytes -= bytes;
    d.stats.external_bytes -= bytes;
  }

 private:
  struct Block {
    size_t size;  // its size class
    int device;   // the CPU device index it was allocated for
  };
  struct DeviceState {
    std::map<size_t, std::vector<void*>> free;  // size class -> cached blocks (no empty lists)
    AllocatorStats stats;
    int64_t limit = kNoMemoryLimit;
  };

  // The rest run with mutex_ held.
  DeviceState& state(int device) { return devices_[device]; }

  // Best fit: the smallest cached block of this size class or a larger one (up to
  // kMaxOversize times), so that a stage's blocks serve the next, smaller stage.
  void* take_cached(int device, size_t size) {
    DeviceState& d = state(device);
    auto it = d.free.lower_bound(size);
    if (it == d.free.end() || it->first > kMaxOversize * size) return nullptr;
    const size_t block = it->first;
    void* ptr = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) d.free.erase(it);
    in_use_.emplace(ptr, Block{block, device});
    note_allocated(d, block);
    return ptr;
  }

  // Past the budget, this device's cache goes back to the system and the check is tried
  // once more; still past it, OutOfMemoryError for the `requested` bytes.
  void check_budget(Device device, size_t size, size_t requested) {
    if (fits_budget(device.index, size)) return;
    release_cached(device.index);
    state(device.index).stats.num_alloc_retries += 1;
    if (!fits_budget(device.index, size)) throw_out_of_memory(device, requested);
  }

  bool fits_budget(int device, size_t size) {
    const DeviceState& d = state(device);
    return d.limit == kNoMemoryLimit || d.stats.reserved_bytes + static_cast<int64_t>(size) <= d.limit;
  }

  void release_cached(int device) {
    DeviceState& d = state(device);
    for (auto& [size, bucket] : d.free) {
      for (void* ptr : bucket) std::free(ptr);
      d.stats.reserved_bytes -= static_cast<int64_t>(size * bucket.size());
    }
    d.free.clear();
  }

  [[noreturn]] void throw_out_of_memory(Device device, size_t nbytes) {
    DeviceState& d = state(device.index);
    d.stats.num_ooms += 1;
    throw OutOfMemoryError(out_of_memory_message(device, static_cast<int64_t>(nbytes), d.stats, d.limit));
  }

  static void note_reserved(DeviceState& d, int64_t size) {
    d.stats.reserved_bytes += size;
    d.stats.peak_reserved_bytes = std::max(d.stats.peak_reserved_bytes, d.stats.reserved_bytes);
  }
  static void note_allocated(DeviceState& d, size_t size) {
    d.stats.allocated_bytes += static_cast<int64_t>(size);
    if (d.stats.allocated_bytes > d.stats.peak_allocated_bytes) {
      d.stats.peak_allocated_bytes = d.stats.allocated_bytes;
      d.stats.external_bytes_at_peak = d.stats.external_bytes;
    }
  }

  mutable std::mutex mutex_;
  std::map<int, DeviceState> devices_;        // CPU device index -> its cache and counts
  std::unordered_map<void*, Block> in_use_;   // block handed out -> its class and device
};

Allocator* g_allocators[kNumDeviceTypes] = {};

}  // namespace

Allocator* get_allocator(DeviceType type) {
  if (type == DeviceType::CPU) {
    // Intentionally leaked: tensors in static objects may be freed after main returns.
    static Allocator* cpu = new CachingCpuAllocator();
    return cpu;
  }
  Allocator* allocator = g_allocators[static_cast<int>(type)];
  LOOM_CHECK(allocator, "no allocator for device type '", device_type_name(type),
             "': this loom was built without that backend (rebuild with -Dcuda=enabled) "
             "or no such device is present");
  return allocator;
}

void set_allocator(DeviceType type, Allocator* allocator) { g_allocators[static_cast<int>(type)] = allocator; }

void Allocator::set_memory_limit(Device device, int64_t) {
  LOOM_FAIL("set_device_memory_limit: the ", device_type_name(device.type),
            " allocator has no memory budget; budgets exist for CPU devices (cpu, cpu:N)");
}
int64_t Allocator::memory_limit(Device) const { return kNoMemoryLimit; }
void Allocator::reserve_external(Device, int64_t) {}
void Allocator::release_external(Device, int64_t) {}

int64_t Allocator::capacity(Device) const {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
}

// MemAvailable (what the kernel can hand out without swapping), else the free pages.
int64_t Allocator::free_memory(Device) const {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
}

AllocatorStats memory_stats(Device device) { return get_allocator(device.type)->stats(device); }

void empty_cache(DeviceType type) { get_allocator(type)->empty_cache(); }

}  // namespace loom
