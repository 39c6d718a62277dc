#include "core/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"

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

// See Note [Caching allocator]. One free list per size class, shared by all CPU
// (virtual) devices because they share host memory. A mutex keeps it thread-safe: DP
// replicas, pipeline stages and DataLoader workers allocate concurrently.
class CachingCpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device) override {
    const size_t size = round_size(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Best fit: the smallest cached block of this size class or a larger one (up to
      // kMaxOversize times), so that a stage's blocks serve the next, smaller stage.
      auto it = free_.lower_bound(size);
      if (it != free_.end() && it->first <= kMaxOversize * size) {
        const size_t block = it->first;
        void* ptr = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);
        in_use_.emplace(ptr, block);
        note_allocated(block);
        return ptr;
      }
    }
    void* ptr = std::aligned_alloc(kAlignment, size);
    if (!ptr) {
      empty_cache();  // one retry with the cache returned to the system
      ptr = std::aligned_alloc(kAlignment, size);
    }
    LOOM_CHECK(ptr, "out of CPU memory: could not allocate ", nbytes, " bytes (",
               stats_.allocated_bytes, " bytes in use by tensors)");
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.reserved_bytes += static_cast<int64_t>(size);
    stats_.system_allocations += 1;
    in_use_.emplace(ptr, size);
    note_allocated(size);
    return ptr;
  }

  void deallocate(void* ptr, size_t, Device) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto block = in_use_.find(ptr);
    LOOM_CHECK(block != in_use_.end(), "CPU allocator: deallocate of ", ptr, ", which it did not hand out");
    const size_t size = block->second;  // the block's own class, which may exceed the request's
    in_use_.erase(block);
    free_[size].push_back(ptr);
    stats_.allocated_bytes -= static_cast<int64_t>(size);
  }

  AllocatorStats stats(Device) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak_stats(Device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, bucket] : free_) {
      for (void* ptr : bucket) std::free(ptr);
      stats_.reserved_bytes -= static_cast<int64_t>(size * bucket.size());
    }
    free_.clear();
  }

 private:
  void note_allocated(size_t size) {  // caller holds mutex_
    stats_.allocated_bytes += static_cast<int64_t>(size);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  }

  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> cached blocks (no empty lists)
  std::unordered_map<void*, size_t> in_use_;   // block handed out -> its size class
  AllocatorStats stats_;
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

AllocatorStats memory_stats(Device device) { return get_allocator(device.type)->stats(device); }

void empty_cache(DeviceType type) { get_allocator(type)->empty_cache(); }

}  // namespace loom
