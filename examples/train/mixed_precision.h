// --amp for train_cifar10: what mixed precision changes in the training step.
//
//   MixedPrecision amp(config.amp, device);
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
// Evaluation stays in float32. On the CPU both work, more slowly than float32: the CPU
// kernels stage 16-bit operands through float32 (Note [16-bit CPU kernels stage through
// float32]); they are there to test the policy, the speed is on CUDA.
// The GradScaler's state is not in checkpoints yet: --resume restarts the fp16 scale.
#pragma once

#include <memory>
#include <string>

#include "autograd/autocast.h"     // defines: autocast::Guard
#include "core/device.h"
#include "core/tensor.h"
#include "nn/optim/grad_scaler.h"  // defines: GradScaler
#include "nn/optim/optimizer.h"

namespace loom::examples {

class MixedPrecision {
 public:
  // amp: none | bf16 | fp16; anything else is a loom::Error naming the choices.
  MixedPrecision(const std::string& amp, Device device);

  // The scope of forward + loss: autocast on `device` for bf16/fp16, nothing for none.
  std::unique_ptr<autocast::Guard> autocast() const;
  void backward(const Tensor& loss);
  // Returns whether the optimizer stepped (fp16 skips steps with inf/NaN gradients).
  bool step(optim::Optimizer& optimizer);
  bool enabled() const { return enabled_; }
  const optim::GradScaler& scaler() const { return scaler_; }

 private:
  bool enabled_;
  DType dtype_;
  DeviceType device_type_;
  optim::GradScaler scaler_;
};

}  // namespace loom::examples
