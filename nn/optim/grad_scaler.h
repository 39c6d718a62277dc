// GradScaler: loss scaling for float16 training, as torch.cuda.amp.GradScaler.
//
//   optim::GradScaler scaler;                       // init_scale 65536
//   for (auto& [x, y] : loader) {
//     opt.zero_grad();
//     Tensor loss;
//     {
//       autocast::Guard guard(DeviceType::CUDA, kFloat16);
//       loss = criterion(model->forward(x), y);
//     }
//     scaler.scale(loss).backward();                // gradients of loss * scale
//     scaler.unscale_(opt);                         // optional: to clip true gradients
//     scaler.step(opt);                             // skipped if a gradient is inf/NaN
//     scaler.update();                              // grow or back off the scale
//   }
//
// Why: float16 has 5 exponent bits; gradients below ~6e-8 flush to zero. Multiplying the
// loss by a large scale S lifts every gradient by S (backward is linear in the upstream
// gradient) into float16's range; step() divides by S again before the update.
// bfloat16 has float32's exponent range and needs none of this (use enabled=false).
//
// Note [Dynamic loss scale]
// S is chosen by trial. A step whose gradients hold an inf or NaN overflowed: it is
// skipped and S is multiplied by backoff_factor (0.5). After growth_interval (2000)
// consecutive finite steps S is multiplied by growth_factor (2). So S hovers near the
// largest value that does not overflow, and only ~1 step in 2000 is wasted. The check
// and the division by S are one pass per gradient (non_finite_check_and_unscale_kernel,
// core/kernels.h), on the gradient's device; the verdict is read back once per step.
//
// Per optimizer, a step goes READY -> (unscale_) UNSCALED -> (step) STEPPED -> (update)
// READY; calling them out of order is an error, as in PyTorch.
//
// Gradients must be float32 (or float64): the parameters stay in float32 under
// autocast. Unscaling float16 gradients in place would lose what scaling saved, so it
// is refused, as PyTorch's allow_fp16=False.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "core/tensor.h"
#include "nn/optim/optimizer.h"
#include "nn/ordered_dict.h"

namespace loom::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  // false: scale() returns its input, step() just steps, update() does nothing, so one
  // training loop serves float32, bfloat16 and float16 runs.
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  virtual ~GradScaler() = default;
  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;

  // outputs * scale (differentiable). Call backward() on the result.
  Tensor scale(const Tensor& outputs) const;
  // Divides the gradients of opt's parameters by the scale in place and records whether
  // any was inf/NaN. At most once per optimizer between update()s.
  void unscale_(Optimizer& opt);
  // unscale_(opt) unless done already, then opt.step() unless a gradient was inf/NaN.
  // Returns whether opt.step() ran (PyTorch returns its result, or None when skipped).
  bool step(Optimizer& opt);
  // Adjusts the scale (Note [Dynamic loss scale]) from the steps since the last update,
  // or sets it to new_scale. Ends the iteration for every optimizer.
  void update(std::optional<double> new_scale = std::nullopt);

  double get_scale() const { return enabled_ ? scale_ : 1.0; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return enabled_; }
  double get_growth_factor() const { return growth_factor_; }
  double get_backoff_factor() const { return backoff_factor_; }
  int64_t get_growth_interval() const { return growth_interval_; }

  // Keys as PyTorch's: "scale", "growth_factor", "backoff_factor", "growth_interval",
  // "_growth_tracker" (float64 / int64 scalars). Empty when disabled.
  OrderedDict<Tensor> state_dict() const;
  void load_state_dict(const OrderedDict<Tensor>& state);

 protected:
  // Whether the step's gradients held an inf/NaN anywhere, given what unscale_ found in
  // this process's gradients of one optimizer: that verdict itself here. Where each rank
  // holds only part of the gradients (FSDP's shards, a tensor-parallel weight's rows, a
  // pipeline stage's parameters) every rank must take the same decision:
  // distributed::ShardedGradScaler (parallel/sharded_grad_scaler.h) reduces it over ranks.
  virtual bool found_inf_anywhere(bool found_here) { return found_here; }

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct OptimizerState {
    Stage stage = Stage::Ready;
    bool found_inf = false;  // valid once unscaled
  };
  OptimizerState& state_of(const Optimizer& opt) { return per_optimizer_[&opt]; }

  double scale_;  // kept as float32 values, as PyTorch's float32 scale tensor
  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  bool enabled_;
  int64_t growth_tracker_ = 0;
  std::map<const Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace loom::optim
