// What every oneDNN-backed CPU kernel shares: the engine, the per-thread scratchpad, the
// plan cache, loom dtypes as oneDNN data types, and the error report.
//
// A *plan* is whatever a kernel builds once per shape and reuses every step: the
// primitive, the reorders around it, the size of its scratchpad. conv2d (core/cpu/
// conv2d.cpp) and the bfloat16 matmul (core/cpu/linalg.cpp) each define their plan
// and its key; PlanCache keeps them (Note [oneDNN plan cache]).
//
// Note [oneDNN plan cache]
// A plan depends only on its key. The cache is a mutex-guarded map of immutable shared
// plans: lookups are rare next to the primitives themselves, and a plan may be used by
// any number of threads once built (Note [oneDNN scratchpad]). It never evicts: a network
// has a handful of shapes (plus a smaller last batch).
//
// Note [oneDNN scratchpad]
// Plans use oneDNN's *user* scratchpad mode: each call hands the primitive a workspace
// instead of letting oneDNN keep one per primitive. That makes one plan safe to execute
// from several threads at once (data-parallel replicas, pipeline stages). The
// workspace is one buffer per calling thread, grown to the largest
// scratchpad that thread has needed, rather than a tensor from the caching allocator:
// Winograd's scratchpads are large and differ per shape (Note [Conv2d algorithm]: 7 to
// 134 MiB per pass on the ResNet18 shapes at batch 128), and the cache would have kept
// one block per size for good (~180 MiB more resident memory per training process).
// Growing frees the old buffer to the system, which happens in the first step only. A
// convolution whose scratchpad would pass 256 MiB runs in batch slices instead (Note
// [Convolutions in batch slices], core/cpu/conv2d.cpp), so the buffer stays below that.
#pragma once

#include <dnnl.hpp>  // defines: dnnl::engine, dnnl::memory, dnnl::error

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace loom::cpu::onednn {

const dnnl::engine& cpu_engine();

// This thread's scratchpad buffer, at least `size` bytes (Note [oneDNN scratchpad]).
// `op` names the kernel in the out-of-memory error.
void* scratchpad(size_t size, const char* op);
// The bytes every thread's scratchpad buffer holds now (for memory reports).
int64_t scratchpad_bytes();

// float32, bfloat16 (and float16) as oneDNN names them; a loom::Error for the rest.
dnnl::memory::data_type data_type(DType dtype);

// Throws a loom::Error at file:line: "<what>: <oneDNN's message> (dnnl_status_t N). Run
// with ONEDNN_VERBOSE=1 ...". `what` says which kernel could not do what, for which shape.
[[noreturn]] void fail(const char* file, int line, const std::string& what, const dnnl::error& e);

// See Note [oneDNN plan cache]. `build(key)` may throw dnnl::error; the caller reports it.
template <typename Key, typename Plan>
class PlanCache {
 public:
  template <typename Build>
  std::shared_ptr<const Plan> get(const Key& key, Build&& build) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = plans_.find(key);
      if (it != plans_.end()) return it->second;
    }
    // Built outside the lock so that threads warming up different shapes don't queue;
    // if two threads build the same plan, the first one stored wins.
    std::shared_ptr<const Plan> plan = build(key);
    std::lock_guard<std::mutex> lock(mutex_);
    return plans_.emplace(key, std::move(plan)).first->second;
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const Plan>> plans_;
};

}  // namespace loom::cpu::onednn
