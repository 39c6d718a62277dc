// Device: where a tensor's memory lives and where its kernels run.
//
// Written like PyTorch: "cpu", "cpu:1", "cuda", "cuda:0". CPU devices with index > 0
// are *virtual devices*: the same host memory under a distinct name. They let every
// multi-device strategy (DP, model parallel, pipeline) run and be tested on a machine
// without GPUs: a copy between two CPU devices is a memcpy, and an op that mixes
// tensors from cpu:0 and cpu:1 is an error exactly as it would be between two GPUs.
#pragma once

#include <cstdint>
#include <functional>  // defines: std::hash, so Device can key an unordered_map
#include <ostream>
#include <string>

namespace loom {

enum class DeviceType : int8_t { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceTypes = 2;

const char* device_type_name(DeviceType type);

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  Device() = default;
  Device(DeviceType type, int index = 0);
  // Parses "cpu", "cpu:2", "cuda", "cuda:1"; anything else is a loom::Error.
  Device(const std::string& spec);  // NOLINT: implicit, as torch.device("cuda:0")
  Device(const char* spec) : Device(std::string(spec)) {}  // NOLINT

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;

  bool operator==(const Device& other) const = default;
};

std::ostream& operator<<(std::ostream& out, const Device& device);

}  // namespace loom

template <>
struct std::hash<loom::Device> {
  size_t operator()(const loom::Device& d) const noexcept {
    return std::hash<int>()(static_cast<int>(d.type) * 1024 + d.index);
  }
};
