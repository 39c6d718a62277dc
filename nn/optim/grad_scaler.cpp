#include "nn/optim/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/factory.h"
#include "core/kernels.h"  // declares: non_finite_check_and_unscale_kernel

namespace loom::optim {
namespace {

// PyTorch keeps the scale in a float32 tensor; rounding every new value to float32 keeps
// loom's schedule bit-identical to it (powers of two are exact anyway).
double as_float32(double value) { return static_cast<double>(static_cast<float>(value)); }

}  // namespace

GradScaler::GradScaler(GradScalerOptions o)
    : scale_(as_float32(o.init_scale)),
      growth_factor_(o.growth_factor),
      backoff_factor_(o.backoff_factor),
      growth_interval_(o.growth_interval),
      enabled_(o.enabled) {
  LOOM_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "GradScaler: expected a finite init_scale > 0, got ",
             o.init_scale);
  LOOM_CHECK(o.growth_factor > 1.0, "GradScaler: the growth factor must be > 1.0, got ", o.growth_factor);
  LOOM_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "GradScaler: the backoff factor must be in (0, 1), got ",
             o.backoff_factor);
  LOOM_CHECK(o.growth_interval > 0, "GradScaler: growth_interval must be a positive integer, got ", o.growth_interval);
}

Tensor GradScaler::scale(const Tensor& outputs) const {
  if (!enabled_) return outputs;
  LOOM_CHECK(outputs.defined() && is_floating(outputs.dtype()),
             "GradScaler.scale: expected a floating-point tensor (the loss), got ",
             outputs.defined() ? outputs.str() : std::string("an undefined tensor"));
  return outputs * scale_;
}

void GradScaler::unscale_(Optimizer& opt) {
  if (!enabled_) return;
  OptimizerState& st = state_of(opt);
  LOOM_CHECK(st.stage != Stage::Unscaled,
             "GradScaler.unscale_() has already been called on this optimizer since the last update()");
  LOOM_CHECK(st.stage != Stage::Stepped, "GradScaler.unscale_() is being called after step(); call it between "
             "backward() and step(), then update() before the next iteration");

  // Computed in float64 then rounded, as PyTorch's scale.double().reciprocal().float().
  const double inv_scale = as_float32(1.0 / scale_);
  std::vector<std::pair<Device, Tensor>> found_inf;  // one flag per device, so no gradient moves
  NoGradGuard no_grad;
  for (ParamGroup& group : opt.param_groups()) {
    for (Tensor& p : group.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      LOOM_CHECK(grad.dtype() != kFloat16 && grad.dtype() != kBFloat16,
                 "GradScaler: attempting to unscale ", grad.dtype(), " gradients (parameter ", p.str(),
                 "); keep parameters in float32 and let autocast cast them per op");
      // The kernel updates in place; a broadcast view (the gradient of sum() is one)
      // becomes a tensor of its own first. See core/kernels.h.
      if (!grad.is_contiguous()) {
        grad = grad.contiguous();
        p.set_grad(grad);
      }
      auto it = std::find_if(found_inf.begin(), found_inf.end(), [&](const auto& e) { return e.first == grad.device(); });
      if (it == found_inf.end())
        it = found_inf.insert(found_inf.end(), {grad.device(), zeros({1}, TensorOptions(kFloat32).device(grad.device()))});
      non_finite_check_and_unscale_kernel(grad.device())(grad, it->second, inv_scale);
      grad.bump_version();
    }
  }
  bool found_here = false;
  for (const auto& [device, flag] : found_inf) found_here = found_here || flag.item<float>() != 0.0f;
  st.found_inf = found_inf_anywhere(found_here);
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(Optimizer& opt) {
  if (!enabled_) {
    opt.step();
    return true;
  }
  OptimizerState& st = state_of(opt);
  LOOM_CHECK(st.stage != Stage::Stepped, "GradScaler.step() has already been called since the last update()");
  if (st.stage == Stage::Ready) unscale_(opt);
  const bool finite = !st.found_inf;
  if (finite) opt.step();
  st.stage = Stage::Stepped;
  return finite;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!enabled_) return;
  if (new_scale) {
    LOOM_CHECK(*new_scale > 0 && std::isfinite(*new_scale), "GradScaler.update: expected a finite new_scale > 0, got ",
               *new_scale);
    scale_ = as_float32(*new_scale);
  } else {
    bool checked = false, found_inf = false;
    for (const auto& [opt, st] : per_optimizer_) {
      if (st.stage == Stage::Ready) continue;
      checked = true;
      found_inf = found_inf || st.found_inf;
    }
    LOOM_CHECK(checked, "GradScaler.update: no inf checks were recorded prior to update(); call "
               "scaler.step(optimizer) (or unscale_) after backward() first");
    // See Note [Dynamic loss scale]; the same arithmetic as torch._amp_update_scale_.
    if (found_inf) {
      scale_ = as_float32(scale_ * backoff_factor_);
      growth_tracker_ = 0;
    } else if (++growth_tracker_ == growth_interval_) {
      const double grown = as_float32(scale_ * growth_factor_);
      if (std::isfinite(grown)) scale_ = grown;  // float32 overflow: keep the old scale
      growth_tracker_ = 0;
    }
  }
  per_optimizer_.clear();
}

OrderedDict<Tensor> GradScaler::state_dict() const {
  OrderedDict<Tensor> out;
  if (!enabled_) return out;
  out.insert("scale", scalar_tensor(scale_, kFloat64));
  out.insert("growth_factor", scalar_tensor(growth_factor_, kFloat64));
  out.insert("backoff_factor", scalar_tensor(backoff_factor_, kFloat64));
  out.insert("growth_interval", scalar_tensor(static_cast<double>(growth_interval_), kInt64));
  out.insert("_growth_tracker", scalar_tensor(static_cast<double>(growth_tracker_), kInt64));
  return out;
}

void GradScaler::load_state_dict(const OrderedDict<Tensor>& state) {
  LOOM_CHECK(enabled_, "GradScaler.load_state_dict: this scaler is disabled (enabled=false); a disabled scaler "
             "has no state to load into");
  LOOM_CHECK(!state.empty(), "GradScaler.load_state_dict: the state is empty; it was saved from a disabled "
             "GradScaler");
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})
    LOOM_CHECK(state.contains(key), "GradScaler.load_state_dict: the state has no \"", key,
               "\" (expected the keys scale, growth_factor, backoff_factor, growth_interval, _growth_tracker)");
  auto value = [&](const char* key) { return state[key].to(kFloat64).item<double>(); };
  scale_ = as_float32(value("scale"));
  growth_factor_ = value("growth_factor");
  backoff_factor_ = value("backoff_factor");
  growth_interval_ = static_cast<int64_t>(value("growth_interval"));
  growth_tracker_ = static_cast<int64_t>(value("_growth_tracker"));
}

}  // namespace loom::optim
