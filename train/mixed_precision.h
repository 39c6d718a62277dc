// --amp for train_cifar10: what mixed precision changes in the training step.
//
//   MixedPrecision amp(config.training.amp, device);
//   { auto scope = amp.autocast(); logits = net(images); loss = criterion(logits, labels); }
//   amp.backward(loss);   // loss.backward(), or scaler.scale(loss).backward() for fp16
//   amp.step(optimizer);  // optimizer.step(), or scaler.step + scaler.update for fp16
//
//   none  float32 throughout (the default)
//   bf16  autocast to bfloat16 around forward + loss (autograd/autocast.h); float32
//         parameters, gradients and optimizer. bfloat16 has float32's exponent range, so
//         no loss scaling is needed.
//   fp16  autocast to float16, plus a GradScaler (nn/optim/grad_scaler.h) against
//         gradient underflow; a step with inf/NaN gradients is skipped.
// Evaluation stays in float32. On the CPU both work with CPU autocast's lists (Note
// [Autocast op lists per device]); bfloat16 runs natively in every kernel of a ResNet
// step where oneDNN has bf16 kernels (Note [bfloat16 on the CPU]; the trainer prints
// which path), float16 partly stages through float32 (docs/mixed_precision.md).
#pragma once

#include <memory>
#include <string>

#include "autograd/autocast.h"     // defines: autocast::Guard
#include "core/cpu/bf16_path.h"    // defines: bf16_autocast_pays
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "nn/optim/grad_scaler.h"  // defines: GradScaler
#include "parallel/sharded_grad_scaler.h"  // defines: ShardedGradScaler
#include "nn/optim/optimizer.h"

namespace loom::training {

// (Header-only: it is a few lines, and examples/meson.build stays untouched.)
class MixedPrecision {
 public:
  // amp: none | bf16 | fp16; anything else is a loom::Error naming the choices.
  // bf16 on a CPU without bfloat16 arithmetic runs float32 instead (Note [bf16 autocast
  // where the CPU has no bfloat16 arithmetic], core/cpu/bf16_path.h): see runs_float32_instead().
  // `world`: the process group of a multi-process run (null in one process); under fp16
  // every rank then skips a step when any rank's gradients overflowed (Note [One verdict
  // on inf for every rank], parallel/sharded_grad_scaler.h).
  MixedPrecision(const std::string& amp, Device device, std::shared_ptr<distributed::Communicator> world = nullptr)
      : dtype_(dtype_of_flag(amp)),
        device_type_(device.type),
        scaler_(std::make_unique<distributed::ShardedGradScaler>(
            std::vector<std::shared_ptr<distributed::Communicator>>{std::move(world)},
            optim::GradScalerOptions{.enabled = amp == "fp16"})) {
    if (dtype_ == kBFloat16 && device.type == DeviceType::CPU && !cpu::bf16_autocast_pays()) {
      dtype_ = kFloat32;
      float32_instead_ = true;
    }
  }
  // Whether --amp bf16 was asked for and float32 runs (the CPU stages bf16 through float32).
  bool runs_float32_instead() const { return float32_instead_; }

  // The scope of forward + loss: autocast on the device for bf16/fp16, nothing for none.
  std::unique_ptr<autocast::Guard> autocast() const {
    if (dtype_ == kFloat32) return nullptr;
    return std::make_unique<autocast::Guard>(device_type_, dtype_);
  }
  // loss.backward(), of the scaled loss under fp16.
  void backward(const Tensor& loss) { scaler_->scale(loss).backward(); }
  // What backward() multiplies the loss by: the GradScaler's scale under fp16, else 1
  // (a pipeline scales each micro-batch's loss itself).
  double loss_scale() const { return scaler_->get_scale(); }
  // optimizer.step(), under fp16 through the scaler: returns false when it skipped a step
  // with inf/NaN gradients.
  bool step(optim::Optimizer& optimizer) {
    const bool stepped = scaler_->step(optimizer);  // a plain optimizer.step() when disabled
    scaler_->update();
    return stepped;
  }
  // Checkpoints save and restore it (train/checkpoint.h).
  optim::GradScaler& scaler() { return *scaler_; }

 private:
  static DType dtype_of_flag(const std::string& amp) {
    if (amp == "bf16") return kBFloat16;
    if (amp == "fp16") return kFloat16;
    LOOM_CHECK(amp == "none", "MixedPrecision: amp is none, bf16 or fp16, got '", amp, "'");
    return kFloat32;
  }

  DType dtype_;  // kFloat32: --amp none
  bool float32_instead_ = false;
  DeviceType device_type_;
  std::unique_ptr<optim::GradScaler> scaler_;
};

}  // namespace loom::training
