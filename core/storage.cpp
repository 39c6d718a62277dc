#include "core/storage.h"

#include "core/allocator.h"

namespace loom {

StorageImpl::StorageImpl(size_t nbytes, Device device)
    : nbytes_(nbytes), device_(device), allocator_(get_allocator(device.type)) {
  data_ = allocator_->allocate(nbytes == 0 ? 1 : nbytes, device);
}

StorageImpl::~StorageImpl() { allocator_->deallocate(data_, nbytes_ == 0 ? 1 : nbytes_, device_); }

}  // namespace loom
