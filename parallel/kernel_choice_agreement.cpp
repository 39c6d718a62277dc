// See parallel/kernel_choice_agreement.h.
#include "parallel/kernel_choice_agreement.h"

#include <cstring>
#include <string>

#include "core/cpu/kernel_benchmark.h"  // defines: backends::cpu::kernel_choices
#include "core/factory.h"               // defines: empty

namespace loom::distributed {

void agree_on_kernel_choices(Communicator& group) {
  backends::cpu::KernelChoices& table = backends::cpu::kernel_choices();
  std::string text = group.rank() == 0 ? table.serialize() : std::string();
  // Collectives move tensors on the group's device (the GPU for nccl): length, then bytes.
  Tensor length = empty({1}, TensorOptions(kInt64));
  length.data_ptr<int64_t>()[0] = static_cast<int64_t>(text.size());
  Tensor length_moved = length.to(group.tensor_device());
  group.broadcast(length_moved, 0)->wait();
  const int64_t size = length_moved.to(Device(DeviceType::CPU)).data_ptr<int64_t>()[0];
  if (size == 0) return;  // nothing to agree on (serialize() always writes a header)
  Tensor bytes = empty({size}, TensorOptions(kUInt8));
  if (group.rank() == 0) std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  Tensor bytes_moved = bytes.to(group.tensor_device());
  group.broadcast(bytes_moved, 0)->wait();
  if (group.rank() == 0) return;
  const Tensor received = bytes_moved.to(Device(DeviceType::CPU));
  text.assign(reinterpret_cast<const char*>(received.data_ptr<uint8_t>()), static_cast<size_t>(size));
  // Ranks of one job may run on different CPUs: rank 0's choices hold wherever they exist.
  table.adopt(text, "rank 0's kernel choices", /*any_isa=*/true);
}

}  // namespace loom::distributed
