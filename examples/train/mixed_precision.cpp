#include "examples/train/mixed_precision.h"

namespace loom::examples {
namespace {

DType amp_dtype(const std::string& amp) {
  if (amp == "bf16") return kBFloat16;
  if (amp == "fp16") return kFloat16;
  LOOM_CHECK(amp == "none", "--amp: expected none, bf16 or fp16, got '", amp, "'");
  return kFloat32;
}

}  // namespace

MixedPrecision::MixedPrecision(const std::string& amp, Device device)
    : enabled_(amp_dtype(amp) != kFloat32),
      dtype_(amp_dtype(amp)),
      device_type_(device.type),
      scaler_({.enabled = amp == "fp16"}) {}

std::unique_ptr<autocast::Guard> MixedPrecision::autocast() const {
  if (!enabled_) return nullptr;
  return std::make_unique<autocast::Guard>(device_type_, dtype_);
}

void MixedPrecision::backward(const Tensor& loss) { scaler_.scale(loss).backward(); }

bool MixedPrecision::step(optim::Optimizer& optimizer) {
  const bool stepped = scaler_.step(optimizer);  // a plain optimizer.step() when disabled
  scaler_.update();
  return stepped;
}

}  // namespace loom::examples
