// The cached pinned host allocator; see cuda/host_allocator.h.
#include "cuda/host_allocator.h"

#include <cuda_runtime_api.h>  // defines: cudaHostAlloc, cudaFreeHost, cudaEvent*

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/check.h"  // defines: LOOM_CUDA_CHECK

namespace loom::cuda {
namespace {

size_t round_size(size_t nbytes) {
  size_t size = 512;
  while (size < nbytes) size <<= 1;
  return size;
}

struct HostBlock {
  size_t size;
  bool allocated = false;
  std::vector<cudaEvent_t> uses;  // see Note [Pinned block reuse]
};

class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device) override {
    const size_t size = round_size(nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reclaim_finished();
      auto& bucket = free_[size];
      if (!bucket.empty()) {
        char* ptr = bucket.back();
        bucket.pop_back();
        blocks_.at(ptr).allocated = true;
        note_allocated(size);
        return ptr;
      }
    }
    LOOM_CHECK(is_available(), "pinned host memory needs a CUDA device, and none is available: ", unavailable_reason(),
               ". Use pin_memory=false on machines without a GPU.");
    void* ptr = nullptr;
    cudaError_t error = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      empty_cache();
      error = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
    }
    LOOM_CUDA_CHECK(error, "allocating ", size, " bytes of pinned host memory (", stats_.allocated_bytes,
                    " bytes pinned for tensors already)");
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_.emplace(static_cast<char*>(ptr), HostBlock{size, true, {}});
    stats_.reserved_bytes += static_cast<int64_t>(size);
    stats_.system_allocations += 1;
    note_allocated(size);
    return ptr;
  }

  void deallocate(void* ptr, size_t, Device) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(static_cast<char*>(ptr));
    if (it == blocks_.end()) return;
    it->second.allocated = false;
    stats_.allocated_bytes -= static_cast<int64_t>(it->second.size);
    if (it->second.uses.empty()) free_[it->second.size].push_back(it->first);
    // Otherwise reclaim_finished() returns it once its copies are done.
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
    reclaim_finished();
    for (auto& [size, bucket] : free_) {
      for (char* ptr : bucket) {
        LOOM_CUDA_CHECK(cudaFreeHost(ptr), "returning ", size, " bytes of pinned host memory");
        blocks_.erase(ptr);
        stats_.reserved_bytes -= static_cast<int64_t>(size);
      }
      bucket.clear();
    }
  }

  // The block containing ptr, or blocks_.end().
  std::map<char*, HostBlock>::iterator find_containing(const void* ptr) {  // caller holds mutex_
    auto p = static_cast<char*>(const_cast<void*>(ptr));
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return blocks_.end();
    --it;
    return p < it->first + it->second.size ? it : blocks_.end();
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    return find_containing(ptr) != blocks_.end();
  }

  void record_use(const void* ptr, Stream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = find_containing(ptr);
    if (it == blocks_.end()) return;
    DeviceGuard guard(stream.device);
    cudaEvent_t event = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "creating an event for a pinned copy");
    LOOM_CUDA_CHECK(cudaEventRecord(event, stream.handle), "recording an event after a pinned copy on cuda:", stream.device);
    it->second.uses.push_back(event);
  }

 private:
  // Drops completed use events; blocks that are free and have no pending use are cached.
  void reclaim_finished() {  // caller holds mutex_
    for (auto& [ptr, block] : blocks_) {
      if (block.uses.empty()) continue;
      std::erase_if(block.uses, [](cudaEvent_t event) {
        if (cudaEventQuery(event) == cudaErrorNotReady) {
          (void)cudaGetLastError();
          return false;
        }
        (void)cudaEventDestroy(event);
        return true;
      });
      if (block.uses.empty() && !block.allocated) free_[block.size].push_back(ptr);
    }
  }

  void note_allocated(size_t size) {  // caller holds mutex_
    stats_.allocated_bytes += static_cast<int64_t>(size);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  }

  mutable std::mutex mutex_;
  std::map<char*, HostBlock> blocks_;                         // every pinned block, by address
  std::unordered_map<size_t, std::vector<char*>> free_;       // cached, by size
  AllocatorStats stats_;
};

PinnedHostAllocator& instance() {
  static auto* allocator = new PinnedHostAllocator();  // leaked, as the device allocator
  return *allocator;
}

}  // namespace

Allocator& pinned_host_allocator() { return instance(); }
bool is_pinned(const void* ptr) { return instance().contains(ptr); }
void record_pinned_use(const void* ptr, Stream stream) { instance().record_use(ptr, stream); }

}  // namespace loom::cuda
