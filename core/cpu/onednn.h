// What every oneDNN-backed CPU kernel shares: the engine, the scratchpad workspace, the
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
// from several threads at once (data-parallel replicas, pipeline stages). The workspace
// is a tensor from the caching allocator (Note [Caching allocator], core/allocator.h),
// held for the call only, as the reorders' buffers around it are. The allocator splits
// and merges its blocks, so a scratchpad borrows memory that is free at that point of
// the step (an activation the backward pass already released) and gives it back for
// the next tensor, where a buffer per thread, grown to the largest scratchpad the thread
// ever needed, held that size outside the cache for the rest of the process: on
// airbench94, 734 MiB through the training and 1.4 GiB from its evaluation on
// (docs/speedrun.md). An evaluation's convolution whose scratchpad and reorders would
// pass 256 MiB runs in batch slices (Note [Convolutions in batch slices], core/cpu/
// conv2d.cpp).
#pragma once

#include <dnnl.hpp>  // defines: dnnl::engine, dnnl::memory, dnnl::error

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace loom::cpu::onednn {

const dnnl::engine& cpu_engine();

// A workspace for `desc` (a scratchpad, or a tensor in a primitive's own layout) from the
// caching allocator, held as long as the tensor (Note [oneDNN scratchpad]).
Tensor workspace(const dnnl::memory::desc& desc);

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
