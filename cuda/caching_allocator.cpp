// The CUDA caching allocator; see Note [Caching allocator on CUDA] and
// Note [Allocator streams] in cuda/caching_allocator.h.
#include "cuda/caching_allocator.h"

#include <cuda_runtime_api.h>  // defines: cudaMalloc, cudaFree, cudaEvent*, cudaMemGetInfo

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/memory.h"  // defines: OutOfMemoryError, out_of_memory_message, kNoMemoryLimit
#include "cuda/check.h"   // defines: LOOM_CUDA_CHECK

namespace loom::cuda {
namespace {

constexpr size_t kMinBlockSize = 512;        // every size rounds up to this
constexpr size_t kSmallSize = 1 << 20;       // largest request served by the small pool
constexpr size_t kSmallSegment = 2 << 20;    // small pool segments
constexpr size_t kMinLargeAlloc = 10 << 20;  // requests below this share ...
constexpr size_t kLargeSegment = 20 << 20;   // ... 20 MiB segments
constexpr size_t kRoundLarge = 2 << 20;      // bigger ones round to 2 MiB

// A piece of a cudaMalloc'ed segment. Blocks of one segment form a list in address
// order (prev/next); all of them belong to the segment's pool and stream.
struct Block {
  Block(int device_, cudaStream_t stream_, size_t size_, char* ptr_, bool small_)
      : device(device_), stream(stream_), size(size_), ptr(ptr_), small(small_) {}

  int device;
  cudaStream_t stream;
  size_t size;
  char* ptr;
  bool small;
  bool allocated = false;
  int pending_events = 0;                  // recorded uses not yet passed; see Note [Allocator streams]
  std::vector<cudaStream_t> stream_uses;   // streams other than `stream` that used it
  Block* prev = nullptr;
  Block* next = nullptr;

  bool is_segment() const { return !prev && !next; }
};

// Free blocks ordered by (stream, size, address): lower_bound on (stream, size) is the
// best fit on that stream.
struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};
using Pool = std::set<Block*, BlockLess>;

struct DeviceState {
  Pool small_pool, large_pool;
  std::unordered_map<void*, Block*> active;          // handed out, by address
  std::deque<std::pair<cudaEvent_t, Block*>> pending;  // freed, waiting for other streams
  AllocatorStats stats;
  int64_t limit = kNoMemoryLimit;  // Note [Device memory budget], core/memory.h

  Pool& pool_of(const Block* block) { return block->small ? small_pool : large_pool; }
};

size_t round_size(size_t nbytes) {
  return std::max(kMinBlockSize, (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMinLargeAlloc) return kLargeSegment;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return buffer;
}

class CudaCachingAllocator final : public Allocator {
 public:
  // Touches no CUDA API: see Note [Lazy CUDA initialisation].
  CudaCachingAllocator() = default;

  void* allocate(size_t nbytes, Device device) override {
    check_device(device);
    const int index = device.index;
    const cudaStream_t stream = current_stream(index).handle;
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = state_of(index);
    process_pending(state);

    Pool& pool = size <= kSmallSize ? state.small_pool : state.large_pool;
    Block key(index, stream, size, nullptr, size <= kSmallSize);
    Block* block = nullptr;
    if (auto it = pool.lower_bound(&key); it != pool.end() && (*it)->stream == stream) {
      block = *it;
      pool.erase(it);
    } else {
      block = new_segment(state, index, stream, size, nbytes);
    }
    split(state, block, size);
    block->allocated = true;
    state.active.emplace(block->ptr, block);
    state.stats.allocated_bytes += static_cast<int64_t>(block->size);
    state.stats.peak_allocated_bytes = std::max(state.stats.peak_allocated_bytes, state.stats.allocated_bytes);
    return block->ptr;
  }

  // Never throws (a Storage destructor calls it): a failure here leaks the block.
  void deallocate(void* ptr, size_t, Device device) override {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = *states_[static_cast<size_t>(device.index)];
    auto it = state.active.find(ptr);
    if (it == state.active.end()) return;  // not ours: a bug elsewhere; never free foreign memory
    Block* block = it->second;
    state.active.erase(it);
    block->allocated = false;
    state.stats.allocated_bytes -= static_cast<int64_t>(block->size);
    if (!block->stream_uses.empty()) {
      // See Note [Allocator streams]: reuse waits until every other stream passes here.
      // A failure (typically at process exit, when the runtime is gone) leaks the block.
      int previous = -1;
      if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(block->device) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
      }
      for (cudaStream_t other : block->stream_uses) {
        cudaEvent_t event = nullptr;
        if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess ||
            cudaEventRecord(event, other) != cudaSuccess) {
          (void)cudaGetLastError();
          ++block->pending_events;  // never completes: the block is leaked, never reused unsafely
          break;
        }
        state.pending.emplace_back(event, block);
        ++block->pending_events;
      }
      block->stream_uses.clear();
      (void)cudaSetDevice(previous);
      return;
    }
    free_block(state, block);
  }

  AllocatorStats stats(Device device) const override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& state = states_[static_cast<size_t>(device.index)];
    return state ? state->stats : AllocatorStats{};
  }

  void reset_peak_stats(Device device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = state_of(device.index);
    state.stats.peak_allocated_bytes = state.stats.allocated_bytes;
    state.stats.peak_reserved_bytes = state.stats.reserved_bytes;
  }

  void set_memory_limit(Device device, int64_t bytes) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mutex_);
    state_of(device.index).limit = bytes;
  }

  int64_t memory_limit(Device device) const override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& state = states_[static_cast<size_t>(device.index)];
    return state ? state->limit : kNoMemoryLimit;
  }

  int64_t capacity(Device device) const override { return mem_get_info(device).second; }
  int64_t free_memory(Device device) const override { return mem_get_info(device).first; }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t index = 0; index < states_.size(); ++index)
      if (states_[index]) release_cached(*states_[index], static_cast<int>(index), /*wait_pending=*/true);
  }

  void record_stream(void* ptr, Device device, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceState& state = state_of(device.index);
    auto it = state.active.find(ptr);
    LOOM_CHECK(it != state.active.end(), "record_stream: the tensor's memory on ", device,
               " was not allocated by loom's CUDA caching allocator");
    Block* block = it->second;
    if (stream == block->stream) return;
    if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) == block->stream_uses.end())
      block->stream_uses.push_back(stream);
  }

 private:
  DeviceState& state_of(int index) {  // caller holds mutex_
    auto& state = states_[static_cast<size_t>(index)];
    if (!state) state = std::make_unique<DeviceState>();
    return *state;
  }

  static std::pair<int64_t, int64_t> mem_get_info(Device device) {
    check_device(device);
    DeviceGuard guard(device.index);
    size_t device_free = 0, device_total = 0;
    LOOM_CUDA_CHECK(cudaMemGetInfo(&device_free, &device_total), "cudaMemGetInfo on ", device);
    return {static_cast<int64_t>(device_free), static_cast<int64_t>(device_total)};
  }

  // Past the device's budget or the GPU's memory: every cached, fully free segment of the
  // device goes back to the driver and the cudaMalloc is tried once more (Note [Device
  // memory budget]); a second failure is PyTorch's report.
  Block* new_segment(DeviceState& state, int index, cudaStream_t stream, size_t size, size_t requested) {
    const size_t bytes = segment_size(size);
    DeviceGuard guard(index);
    const auto fits_budget = [&] {
      return state.limit == kNoMemoryLimit || state.stats.reserved_bytes + static_cast<int64_t>(bytes) <= state.limit;
    };
    const auto try_malloc = [&](void** ptr) {
      if (!fits_budget()) return cudaErrorMemoryAllocation;
      return cudaMalloc(ptr, bytes);
    };
    void* ptr = nullptr;
    cudaError_t error = try_malloc(&ptr);
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached(state, index, /*wait_pending=*/true);
      state.stats.num_alloc_retries += 1;
      error = try_malloc(&ptr);
    }
    if (error == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      state.stats.num_ooms += 1;
      throw OutOfMemoryError(out_of_memory_message(Device(DeviceType::CUDA, index), static_cast<int64_t>(requested),
                                                   state.stats, state.limit) +
                             " (check `nvidia-smi` for other processes)");
    }
    LOOM_CUDA_CHECK(error, "allocating ", format_bytes(bytes), " on cuda:", index);
    state.stats.reserved_bytes += static_cast<int64_t>(bytes);
    state.stats.peak_reserved_bytes = std::max(state.stats.peak_reserved_bytes, state.stats.reserved_bytes);
    state.stats.system_allocations += 1;
    return new Block(index, stream, bytes, static_cast<char*>(ptr), size <= kSmallSize);
  }

  // Keeps the first `size` bytes of `block` and returns the rest to its pool, when
  // the rest is worth keeping apart (Note [Caching allocator on CUDA]).
  static void split(DeviceState& state, Block* block, size_t size) {
    const size_t rest = block->size - size;
    if (block->small ? rest < kMinBlockSize : rest <= kSmallSize) return;
    auto* remainder = new Block(block->device, block->stream, rest, block->ptr + size, block->small);
    remainder->prev = block;
    remainder->next = block->next;
    if (block->next) block->next->prev = remainder;
    block->next = remainder;
    block->size = size;
    state.pool_of(remainder).insert(remainder);
  }

  static bool is_cached(const Block* block) { return block && !block->allocated && block->pending_events == 0; }

  // Merges `block` with free neighbours and puts the result in its pool.
  static void free_block(DeviceState& state, Block* block) {
    Pool& pool = state.pool_of(block);
    if (Block* prev = block->prev; is_cached(prev)) {
      pool.erase(prev);
      prev->size += block->size;
      prev->next = block->next;
      if (block->next) block->next->prev = prev;
      delete block;
      block = prev;
    }
    if (Block* next = block->next; is_cached(next)) {
      pool.erase(next);
      block->size += next->size;
      block->next = next->next;
      if (next->next) next->next->prev = block;
      delete next;
    }
    pool.insert(block);
  }

  // Returns blocks whose recorded streams have all passed their free to the pools.
  static void process_pending(DeviceState& state) {
    for (auto it = state.pending.begin(); it != state.pending.end();) {
      cudaError_t status = cudaEventQuery(it->first);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        ++it;
        continue;
      }
      LOOM_CUDA_CHECK(status, "checking whether a stream has finished with a freed block");
      (void)cudaEventDestroy(it->first);
      Block* block = it->second;
      it = state.pending.erase(it);
      if (--block->pending_events == 0) free_block(state, block);
    }
  }

  // cudaFree's every fully free segment of one device.
  static void release_cached(DeviceState& state, int index, bool wait_pending) {
    DeviceGuard guard(index);
    if (wait_pending) {
      for (auto& [event, block] : state.pending) (void)cudaEventSynchronize(event);
      process_pending(state);
    }
    for (Pool* pool : {&state.small_pool, &state.large_pool}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* block = *it;
        if (!block->is_segment()) {
          ++it;
          continue;
        }
        LOOM_CUDA_CHECK(cudaFree(block->ptr), "returning ", format_bytes(block->size), " of cached memory on cuda:", index);
        state.stats.reserved_bytes -= static_cast<int64_t>(block->size);
        it = pool->erase(it);
        delete block;
      }
    }
  }

  mutable std::mutex mutex_;
  std::array<std::unique_ptr<DeviceState>, kMaxDevices> states_;
};

// Intentionally leaked: tensors held by static objects are freed after main returns.
CudaCachingAllocator& instance() {
  static auto* allocator = new CudaCachingAllocator();
  return *allocator;
}

// Installed at load time; see Note [Lazy CUDA initialisation].
[[maybe_unused]] const bool g_installed = [] {
  set_allocator(DeviceType::CUDA, &instance());
  return true;
}();

}  // namespace

Allocator& caching_allocator() { return instance(); }

void record_stream(const Tensor& tensor, Stream stream) {
  LOOM_CHECK(tensor.device().is_cuda() && tensor.device().index == stream.device, "record_stream: tensor on ",
             tensor.device(), " but stream on cuda:", stream.device, "; a tensor can only be used by streams of its device");
  instance().record_stream(tensor.storage()->data(), tensor.device(), stream.handle);
}

}  // namespace loom::cuda
