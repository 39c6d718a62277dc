#include "core/allocator.h"

#include <sys/mman.h>  // defines: mmap, munmap (the segments)
#include <unistd.h>    // defines: sysconf, for the host's memory

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/memory.h"  // defines: OutOfMemoryError, out_of_memory_message, kNoMemoryLimit

namespace loom {
namespace {

// See Note [Caching allocator] for each constant.
constexpr size_t kMinBlockSize = 512;      // every size rounds up to this (and blocks stay 64-byte aligned)
constexpr size_t kSmallSize = 1 << 20;     // largest request served by the small pool
constexpr size_t kSmallSegment = 2 << 20;  // small pool segments
constexpr size_t kRoundLarge = 2 << 20;    // large pool segments round to this
constexpr size_t kMaxSplitSize = 256 << 20;  // larger blocks are oversize: never split

bool oversize(size_t size) { return size > kMaxSplitSize; }

size_t round_size(size_t nbytes) {
  return std::max(kMinBlockSize, (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize);
}

size_t segment_size(size_t size) {
  return size <= kSmallSize ? kSmallSegment : (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

// A piece of a mapped segment. The blocks of one segment form a list in address order
// (prev/next); a segment that is one free block is fully free.
struct Block {
  char* ptr;
  size_t size;
  int device;   // the CPU device index it serves
  bool small;   // which pool
  bool allocated = false;
  uint64_t idle_since = 0;  // the allocator's clock when it was last freed
  Block* prev = nullptr;
  Block* next = nullptr;

  bool is_segment() const { return !prev && !next; }
};

// Free blocks by (size, address): lower_bound on the size is the best fit.
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    return std::less<const char*>()(a->ptr, b->ptr);
  }
};
using Pool = std::set<Block*, BlockLess>;

// See Note [Caching allocator]. Per device (each virtual CPU device caches its own blocks,
// as a GPU does). A mutex keeps it thread-safe: DP replicas, pipeline stages and
// DataLoader workers allocate concurrently.
class CachingCpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& d = state(device.index);
    Pool& pool = size <= kSmallSize ? d.small_pool : d.large_pool;
    Block key{nullptr, size, device.index, size <= kSmallSize};
    Block* block = nullptr;
    // An oversize block serves oversize requests only (Note [Caching allocator]).
    if (auto it = pool.lower_bound(&key); it != pool.end() && (oversize(size) || !oversize((*it)->size))) {
      block = *it;
      pool.erase(it);
    } else {
      block = new_segment(d, device, size, nbytes);
    }
    split(d, block, size);
    block->allocated = true;
    in_use_.emplace(block->ptr, block);
    note_allocated(d, block->size);
    return block->ptr;
  }

  void deallocate(void* ptr, size_t, Device) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = in_use_.find(ptr);
    LOOM_CHECK(found != in_use_.end(), "CPU allocator: deallocate of ", ptr, ", which it did not hand out");
    Block* block = found->second;  // the block knows its device (Storage's device may be re-labelled)
    in_use_.erase(found);
    DeviceState& d = state(block->device);
    block->allocated = false;
    d.stats.allocated_bytes -= static_cast<int64_t>(block->size);
    free_block(d, block);
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
    for (auto& entry : devices_) release_cached(entry.second);
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
    DeviceState& d = state(device.index);
    const auto size = static_cast<size_t>(bytes);
    check_budget(d, device, size, size);
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
  struct DeviceState {
    Pool small_pool, large_pool;  // free blocks
    AllocatorStats stats;
    int64_t limit = kNoMemoryLimit;

    Pool& pool_of(const Block* block) { return block->small ? small_pool : large_pool; }
  };

  // The rest run with mutex_ held.
  DeviceState& state(int device) { return devices_[device]; }

  // Maps a segment for a request nothing cached fits: within the budget (Note [Device
  // memory budget]), after the pool's idle segments went back (Note [Caching allocator]).
  Block* new_segment(DeviceState& d, Device device, size_t size, size_t requested) {
    const size_t bytes = segment_size(size);
    const bool small = size <= kSmallSize;
    check_budget(d, device, bytes, requested);
    release_idle(d, small ? d.small_pool : d.large_pool, bytes, oversize(bytes));
    void* ptr = map(bytes);
    if (!ptr) {  // the system refused: one retry with every device's cache returned to it
      for (auto& entry : devices_) release_cached(entry.second);
      d.stats.num_alloc_retries += 1;
      ptr = map(bytes);
      if (!ptr) throw_out_of_memory(d, device, requested);
    }
    note_reserved(d, static_cast<int64_t>(bytes));
    d.stats.system_allocations += 1;
    return new Block{static_cast<char*>(ptr), bytes, device.index, small};
  }

  static void* map(size_t bytes) {
    void* ptr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return ptr == MAP_FAILED ? nullptr : ptr;
  }

  static void unmap(DeviceState& d, Block* block) {
    munmap(block->ptr, block->size);  // fails only for an address that is not a mapping
    d.stats.reserved_bytes -= static_cast<int64_t>(block->size);
    delete block;
  }

  // Keeps the first `size` bytes of `block` and returns the rest to its pool when the rest
  // is worth keeping apart (Note [Caching allocator]).
  static void split(DeviceState& d, Block* block, size_t size) {
    const size_t rest = block->size - size;
    if (block->small ? rest < kMinBlockSize : rest <= kSmallSize || oversize(block->size)) return;
    auto* remainder = new Block{block->ptr + size, rest, block->device, block->small};
    remainder->idle_since = block->idle_since;
    remainder->prev = block;
    remainder->next = block->next;
    if (block->next) block->next->prev = remainder;
    block->next = remainder;
    block->size = size;
    d.pool_of(remainder).insert(remainder);
  }

  static bool is_free(const Block* block) { return block && !block->allocated; }

  // Merges `block` with its free neighbours and puts the result in its pool.
  void free_block(DeviceState& d, Block* block) {
    Pool& pool = d.pool_of(block);
    if (Block* prev = block->prev; is_free(prev)) {
      pool.erase(prev);
      prev->size += block->size;
      prev->next = block->next;
      if (block->next) block->next->prev = prev;
      delete block;
      block = prev;
    }
    if (Block* next = block->next; is_free(next)) {
      pool.erase(next);
      block->size += next->size;
      block->next = next->next;
      if (next->next) next->next->prev = block;
      delete next;
    }
    block->idle_since = ++clock_;
    pool.insert(block);
  }

  // Unmaps `pool`'s fully free segments of the request's kind (oversize or not), longest
  // idle first, until `bytes` went back.
  static void release_idle(DeviceState& d, Pool& pool, size_t bytes, bool for_oversize) {
    std::vector<Block*> idle;
    for (Block* block : pool)
      if (block->is_segment() && oversize(block->size) == for_oversize) idle.push_back(block);
    std::sort(idle.begin(), idle.end(), [](const Block* a, const Block* b) { return a->idle_since < b->idle_since; });
    size_t released = 0;
    for (Block* block : idle) {
      if (released >= bytes) break;
      released += block->size;
      pool.erase(block);
      unmap(d, block);
    }
  }

  // Every fully free segment of the device back to the system.
  static void release_cached(DeviceState& d) {
    for (Pool* pool : {&d.small_pool, &d.large_pool}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* block = *it;
        if (!block->is_segment()) {
          ++it;
          continue;
        }
        it = pool->erase(it);
        unmap(d, block);
      }
    }
  }

  // Past the budget, this device's cache goes back to the system and the check is tried
  // once more; still past it, OutOfMemoryError for the `requested` bytes.
  void check_budget(DeviceState& d, Device device, size_t size, size_t requested) {
    if (fits_budget(d, size)) return;
    release_cached(d);
    d.stats.num_alloc_retries += 1;
    if (!fits_budget(d, size)) throw_out_of_memory(d, device, requested);
  }

  static bool fits_budget(const DeviceState& d, size_t size) {
    return d.limit == kNoMemoryLimit || d.stats.reserved_bytes + static_cast<int64_t>(size) <= d.limit;
  }

  [[noreturn]] static void throw_out_of_memory(DeviceState& d, Device device, size_t nbytes) {
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
  std::map<int, DeviceState> devices_;         // CPU device index -> its pools and counts
  std::unordered_map<void*, Block*> in_use_;   // block handed out -> its block
  uint64_t clock_ = 0;                         // counts frees, for idle_since
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
