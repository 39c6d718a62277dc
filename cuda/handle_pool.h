// Internal to cuda/: per-device pools of library handles (cuBLAS, cuDNN).
//
// A cuBLAS or cuDNN handle is bound to the device that was current when it was created,
// and must not be used by two threads at once. DP replicas and pipeline stages launch
// matmuls and convolutions from several threads, so each call *borrows* a handle of its
// device for its own duration:
//
//   HandleLease<cublasHandle_t> lease(cublas_handles(), device);  // lease.handle
//
// Handles are created on demand (so there are as many as threads ever used one device
// at the same time) and live until the process exits: destroying them from static
// destructors would race with the CUDA runtime's own teardown.
#pragma once

#include <mutex>
#include <vector>

#include "cuda/device.h"  // defines: kMaxDevices, DeviceGuard

namespace loom::cuda {

template <typename Handle>
class HandlePool {
 public:
  using Create = Handle (*)(int device);  // called with `device` current
  explicit HandlePool(Create create) : create_(create) {}

  Handle acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& free = free_[static_cast<size_t>(device)];
      if (!free.empty()) {
        Handle handle = free.back();
        free.pop_back();
        return handle;
      }
    }
    DeviceGuard guard(device);
    return create_(device);
  }

  void release(int device, Handle handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[static_cast<size_t>(device)].push_back(handle);
  }

 private:
  Create create_;
  std::mutex mutex_;
  std::vector<Handle> free_[kMaxDevices];
};

template <typename Handle>
struct HandleLease {
  HandleLease(HandlePool<Handle>& pool_, int device_) : pool(pool_), device(device_), handle(pool_.acquire(device_)) {}
  ~HandleLease() { pool.release(device, handle); }
  HandleLease(const HandleLease&) = delete;
  HandleLease& operator=(const HandleLease&) = delete;

  HandlePool<Handle>& pool;
  int device;
  Handle handle;
};

}  // namespace loom::cuda
