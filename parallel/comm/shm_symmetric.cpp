// ShmCollectives' symmetric memory: the allocation every rank makes together, and the
// lookup that tells all_reduce a tensor lies in it. See Note [Symmetric memory] in
// communicator.h; the all_reduce itself is all_reduce_symmetric in shm_collectives.cpp.
#include <utility>  // defines: std::pair (a storage's two owners)

#include "core/error.h"
#include "core/factory.h"  // defines: zeros
#include "core/memory.h"   // defines: reserve_external_memory
#include "core/storage.h"  // defines: StorageImpl (over external memory)
#include "parallel/comm/shm_collectives.h"

namespace loom::distributed {

Tensor ShmCollectives::zeros_symmetric(TCPStore& store, const std::string& prefix, const Shape& shape,
                                       TensorOptions options, std::string* why_not) {
  const DType dtype = options.dtype_;
  const int64_t id = symmetric_allocations_++;  // the same on every rank: calls are collective
  const size_t nbytes = static_cast<size_t>(numel(shape)) * element_size(dtype);
  const size_t stride = whole_pages(nbytes);  // each rank's block: page-aligned
  std::string why;
  SharedMemorySegment mapped =
      share_segment(store, detail::str(prefix, "/shm/symmetric/", id), rank_, size_, stride * size_t(size_),
                    prefix + "-sym", options_.timeout, /*refusal=*/"", [](void*) {}, &why);
  if (!mapped.mapped()) {
    if (why_not) *why_not = why;
    return zeros(shape, options);
  }
  // The segment is zero-filled (Note [Reserve the memory up front]); each rank's tensor
  // views its own block, and the storage owns the mapping, so the memory outlives this
  // communicator for as long as a tensor uses it. The block counts against the device's
  // budget and in its statistics as if the caching allocator had handed it out (Note
  // [Device memory budget], core/memory.h): DDP's buckets and FSDP's shards live here.
  std::shared_ptr<void> charge = reserve_external_memory(static_cast<int64_t>(stride), options.device_);
  auto segment = std::make_shared<SharedMemorySegment>(std::move(mapped));
  auto* base = static_cast<uint8_t*>(segment->data());
  {
    std::lock_guard<std::mutex> lock(symmetric_mutex_);
    std::erase_if(symmetric_, [](const SymmetricRegion& r) { return r.segment.expired(); });
    symmetric_.push_back({segment, base, stride, id});
  }
  auto owner = std::make_shared<std::pair<std::shared_ptr<SharedMemorySegment>, std::shared_ptr<void>>>(segment, charge);
  auto storage = std::make_shared<StorageImpl>(base + size_t(rank_) * stride, nbytes, options.device_, owner);
  return make_tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

ShmCollectives::SymmetricPlace ShmCollectives::find_symmetric(const Tensor& tensor) {
  if (!tensor.defined() || tensor.device().type != DeviceType::CPU || !tensor.is_contiguous()) return {};
  const auto* data = static_cast<const uint8_t*>(tensor.raw_data());
  std::lock_guard<std::mutex> lock(symmetric_mutex_);
  for (const SymmetricRegion& region : symmetric_) {
    const uint8_t* mine = region.base + size_t(rank_) * region.stride;
    if (data < mine || data + tensor.nbytes() > mine + region.stride) continue;
    auto segment = region.segment.lock();
    if (!segment) continue;  // freed, and its address range reused by another mapping
    return SymmetricPlace{std::move(segment), region.base, region.stride, region.id, data - mine};
  }
  return {};
}

}  // namespace loom::distributed
