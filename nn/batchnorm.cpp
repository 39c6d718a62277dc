#include "nn/batchnorm.h"

#include "autograd/autocast.h"  // defines: autocast::apply, for synchronised statistics
#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace loom::nn {

BatchNorm2d::BatchNorm2d(int64_t num_features_, double eps_, std::optional<double> momentum_, bool affine_,
                         bool track_running_stats_)
    : Cloneable("BatchNorm2d"),
      num_features(num_features_),
      eps(eps_),
      momentum(momentum_),
      affine(affine_),
      track_running_stats(track_running_stats_) {
  LOOM_CHECK(num_features > 0, "BatchNorm2d: num_features must be positive, got ", num_features);
  LOOM_CHECK(!momentum || (*momentum >= 0 && *momentum <= 1), "BatchNorm2d: momentum must be in [0, 1], got ",
             *momentum);
  reset();
}

void BatchNorm2d::reset() {
  weight = register_parameter("weight", affine ? empty({num_features}) : Tensor());
  bias = register_parameter("bias", affine ? empty({num_features}) : Tensor());
  running_mean = register_buffer("running_mean", track_running_stats ? empty({num_features}) : Tensor());
  running_var = register_buffer("running_var", track_running_stats ? empty({num_features}) : Tensor());
  num_batches_tracked =
      register_buffer("num_batches_tracked", track_running_stats ? empty({}, TensorOptions(kInt64)) : Tensor());
  reset_parameters();
}

void BatchNorm2d::reset_running_stats() {
  if (!track_running_stats) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
}

void BatchNorm2d::reset_parameters() {
  reset_running_stats();
  if (!affine) return;
  init::ones_(weight);
  init::zeros_(bias);
}

double BatchNorm2d::prepare(const Tensor& input) {
  LOOM_CHECK(input.dim() == 4, "BatchNorm2d: expected 4D input [N, C, H, W], got ", input.dim(), "D input of shape ",
             input.shape());
  LOOM_CHECK(input.size(1) == num_features, "BatchNorm2d(", num_features, "): expected ", num_features,
             " channels in dim 1, got input of shape ", input.shape());
  // See Note [BatchNorm statistics].
  double factor = momentum.value_or(0.0);
  if (is_training() && track_running_stats) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(scalar_tensor(1, TensorOptions(kInt64).device(num_batches_tracked.device())));
    if (!momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  return factor;
}

namespace {

// SyncBatchNorm's op is not an autocast entry point; give it the float32 policy of
// "sync_batch_norm" here so that --amp works with --sync-bn (Note [Autocast op lists per
// device]: its statistics ops take one dtype, unlike the CPU's mixed batch_norm kernel).
Tensor sync_input(const Tensor& input) {
  Tensor x = input;
  if (autocast::any_enabled()) autocast::apply("sync_batch_norm", {&x});
  return x;
}

}  // namespace

Tensor BatchNorm2d::forward(const Tensor& input) {
  const double factor = prepare(input);
  // See Note [Synchronised batch statistics].
  if (sync && is_training()) return sync->batch_norm(sync_input(input), running_mean, running_var, weight, bias, factor, eps);
  return batch_norm(input, running_mean, running_var, weight, bias, is_training(), factor, eps);
}

Tensor BatchNorm2d::forward_relu(const Tensor& input, const Tensor& residual) {
  const double factor = prepare(input);
  if (sync && is_training()) {  // synchronised statistics: the same epilogue, unfused
    Tensor out = sync->batch_norm(sync_input(input), running_mean, running_var, weight, bias, factor, eps);
    return relu(residual.defined() ? out + sync_input(residual) : out);
  }
  return batch_norm_relu(input, running_mean, running_var, weight, bias, is_training(), factor, eps, residual);
}

std::string BatchNorm2d::extra_repr() const {
  return detail::str(num_features, ", eps=", eps, ", momentum=", momentum ? detail::str(*momentum) : "None",
                     ", affine=", affine ? "True" : "False", ", track_running_stats=",
                     track_running_stats ? "True" : "False",
                     sync ? ", sync=SyncBatchNorm(" + sync->describe() + ")" : "");
}

}  // namespace loom::nn
