// Storage: a refcounted block of device memory that one or more tensors view.
//
// Note [Version counter]
// Every in-place write to a storage bumps its version. Autograd remembers the version
// of each tensor it saves for backward; if the version has moved when backward runs,
// the saved values are no longer the ones the forward used, and backward refuses with
// an error naming the op (see autograd/saved_tensor.h). The counter lives on the
// storage so that all views of the same memory share it, as in PyTorch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace loom {

class Allocator;

class StorageImpl {
 public:
  StorageImpl(size_t nbytes, Device device);  // allocates from the device's allocator
  // Memory loom did not allocate (a shared-memory mapping, say): `keep_alive` owns it and
  // is released with the storage. Like the deleter of PyTorch's from_blob.
  StorageImpl(void* data, size_t nbytes, Device device, std::shared_ptr<void> keep_alive);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint32_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;     // null for external memory
  std::shared_ptr<void> keep_alive_;   // external memory's owner
  std::atomic<uint32_t> version_{0};
};

using Storage = std::shared_ptr<StorageImpl>;

}  // namespace loom
