#include "train/device.h"

#include <vector>

#include "autograd/ops.h"            // defines: argmax, eq, sum, stack
#include "core/cpu/activation_layout.h"  // defines: cpu::activation_format (Note [Channels-last on AVX2])
#include "core/error.h"
#include "core/memory.h"             // defines: parse_memory_size, set_device_memory_limit
#include "cuda/device.h"             // defines: cuda::is_compiled, is_available, unavailable_reason
#include "cuda/host_allocator.h"     // defines: cuda::copy_to_device_async

namespace loom::training {

Device training_device(const std::string& flag, int default_index) {
  Device device;
  try {
    device = Device(flag);
  } catch (const Error& e) {
    LOOM_FAIL("--device: expected cpu, cpu:N, cuda or cuda:N, got '", flag, "' (", e.what(), ")");
  }
  if (!device.is_cuda()) return device;
  if (flag.find(':') == std::string::npos) device.index = default_index;
  LOOM_CHECK(cuda::is_compiled(), "--device ", flag, ": this loom was built without the CUDA backend "
             "(reconfigure with -Dcuda=enabled on a machine with the CUDA toolkit), or train with --device cpu");
  LOOM_CHECK(cuda::is_available(), "--device ", flag, ": no CUDA device is available: ", cuda::unavailable_reason(),
             ". Train on the CPU with --device cpu, or check that `nvidia-smi` lists a GPU");
  LOOM_CHECK(device.index < cuda::device_count(), "--device ", flag, ": ", device, " does not exist; ",
             cuda::device_count(), " CUDA device(s) are visible (cuda:0..cuda:", cuda::device_count() - 1, ")");
  return device;
}

void apply_device_memory_limit(const std::string& flag, Device first, int64_t count) {
  if (flag.empty()) return;
  int64_t bytes = 0;
  try {
    bytes = parse_memory_size(flag);
  } catch (const Error& e) {
    LOOM_FAIL("--device-memory-limit: ", e.what());
  }
  for (int64_t i = 0; i < count; ++i) {
    const Device device(first.type, first.index + static_cast<int>(i));
    if (device.is_cuda() && device.index >= cuda::device_count()) break;
    set_device_memory_limit(bytes, device);
  }
}

MemoryFormat input_memory_format(const std::string& flag, const std::string& amp, Device device) {
  if (flag == "contiguous") return MemoryFormat::Contiguous;
  if (flag == "channels_last") return MemoryFormat::ChannelsLast;
  LOOM_CHECK(flag == "auto", "input_memory_format: auto, contiguous or channels_last, got '", flag, "'");
  if (!device.is_cpu()) return MemoryFormat::Contiguous;
  if (amp == "bf16") return MemoryFormat::ChannelsLast;
  return amp == "none" ? cpu::activation_format(kFloat32) : MemoryFormat::Contiguous;  // Note [Channels-last on AVX2]
}

Tensor to_training_device(const Tensor& batch, Device device, MemoryFormat format) {
  Tensor on_device = batch;
  if (batch.device() != device) {
    on_device = device.is_cuda() && batch.device().is_cpu() ? cuda::copy_to_device_async(batch, device)
                                                             : batch.to(device);
  }
  // Labels and other non-image tensors stay as they are.
  return format == MemoryFormat::ChannelsLast && on_device.dim() == 4 ? on_device.contiguous(format) : on_device;
}

std::pair<float, int64_t> read_loss_and_correct(const Tensor& loss, const Tensor& logits, const Tensor& labels) {
  const Tensor correct = sum(eq(argmax(logits.detach(), 1), labels).to(kInt64));
  // One device -> host copy (and so one wait for the GPU) for both numbers; a count of
  // at most a batch is exact in float64, and the float loss survives the round trip. The
  // loss may be on another device than the logits: --pp with --device cpu:1 reports its
  // loss on cpu and the last stage's logits on cpu:1.
  const std::vector<double> both =
      stack({loss.detach().to(kFloat64), correct.to(kFloat64).to(loss.device())}).tolist<double>();
  return {static_cast<float>(both[0]), static_cast<int64_t>(both[1])};
}

}  // namespace loom::training
