#include "core/device.h"

#include "core/error.h"

namespace loom {

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
  }
  return "unknown";
}

Device::Device(DeviceType type_, int index_) : type(type_), index(index_) {
  LOOM_CHECK(index >= 0, "device index must be >= 0, got ", index);
}

Device::Device(const std::string& spec) {
  auto colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  if (kind == "cpu") {
    type = DeviceType::CPU;
  } else if (kind == "cuda") {
    type = DeviceType::CUDA;
  } else {
    LOOM_FAIL("unknown device '", spec, "': expected 'cpu', 'cpu:N', 'cuda' or 'cuda:N'");
  }
  if (colon != std::string::npos) {
    std::string digits = spec.substr(colon + 1);
    bool ok = !digits.empty() && digits.size() < 6 &&
              digits.find_first_not_of("0123456789") == std::string::npos;
    LOOM_CHECK(ok, "bad device index in '", spec, "': expected a non-negative integer after ':'");
    index = std::stoi(digits);
  }
}

std::string Device::str() const {
  std::string name = device_type_name(type);
  return name + ":" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

}  // namespace loom
