#include "core/storage.h"

#include "core/allocator.h"
#include "core/flop_counter.h"  // defines: FlopCounterMode (Note [Counted, not timed])

namespace loom {

StorageImpl::StorageImpl(size_t nbytes, Device device)
    : nbytes_(nbytes), device_(device), allocator_(get_allocator(device.type)) {
  data_ = allocator_->allocate(nbytes == 0 ? 1 : nbytes, device);
  FlopCounterMode::add_allocation(static_cast<int64_t>(nbytes));
}

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, std::shared_ptr<void> keep_alive)
    : data_(data), nbytes_(nbytes), device_(device), keep_alive_(std::move(keep_alive)) {}

StorageImpl::~StorageImpl() {
  if (allocator_) allocator_->deallocate(data_, nbytes_ == 0 ? 1 : nbytes_, device_);
}

}  // namespace loom
