#include "parallel/sync_batch_norm.h"

#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: cat, mean, var, the elementwise ops
#include "autograd/saved_tensor.h"  // defines: SavedTensor
#include "autograd/variable.h"   // defines: record, any_requires_grad
#include "core/kernels.h"        // defines: batch_norm_forward_kernel, batch_norm_backward_kernel

namespace loom {
namespace {

using distributed::Communicator;


TensorOptions options_of(const Tensor& t) { return TensorOptions(t.dtype()).device(t.device()); }

// The dims a per-channel statistic reduces over: all but dim 1 of [N, C, ...].
Shape reduced_dims(const Tensor& input) {
  Shape dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A [C] per-channel tensor viewed so that it broadcasts against [N, C, ...].
Tensor per_channel_view(const Tensor& t, const Tensor& input) {
  Shape shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return t.view(shape);
}

struct GlobalMoments {
  std::vector<double> mean, biased_var, unbiased_var;
  double count = 0;
};

// See Note [SyncBatchNorm communication]: every rank's (n, mean, M2), combined exactly.
GlobalMoments gather_moments(const Tensor& x, Communicator& comm) {
  const int64_t channels = x.size(1);
  const double local_count = static_cast<double>(x.numel() / channels);
  Tensor local;
  {
    NoGradGuard no_grad;
    Shape dims = reduced_dims(x);
    // A rank with an empty batch contributes n = 0 and zero moments: the mean of nothing
    // is NaN, and 0 * NaN would make every rank's statistics NaN.
    const TensorOptions f64 = TensorOptions(kFloat64).device(x.device());
    Tensor mean = local_count > 0 ? x.mean(dims).to(kFloat64) : zeros({channels}, f64);
    Tensor m2 = local_count > 0 ? x.var(dims, /*unbiased=*/false).to(kFloat64) * local_count : zeros({channels}, f64);
    local = cat({mean, m2, full({1}, local_count, f64)});
  }
  std::vector<Tensor> gathered;
  comm.all_gather(gathered, local)->wait();

  const auto C = static_cast<size_t>(channels);
  GlobalMoments g;
  std::vector<std::vector<double>> ranks;
  for (const Tensor& t : gathered) {
    ranks.push_back(t.to(Device("cpu")).tolist<double>());
    g.count += ranks.back()[2 * C];
  }
  LOOM_CHECK(g.count > 1, "SyncBatchNorm: expected more than 1 value per channel over all ranks when training, got ",
             g.count, " (input ", x.shape(), " on this rank); use larger batches or eval mode");
  g.mean.assign(C, 0.0);
  g.biased_var.assign(C, 0.0);
  g.unbiased_var.assign(C, 0.0);
  for (const auto& r : ranks)
    for (size_t c = 0; c < C; ++c) g.mean[c] += r[2 * C] * r[c] / g.count;
  for (size_t c = 0; c < C; ++c) {
    double m2 = 0;
    for (const auto& r : ranks) {
      const double shift = r[c] - g.mean[c];
      m2 += r[C + c] + r[2 * C] * shift * shift;
    }
    g.biased_var[c] = m2 / g.count;
    g.unbiased_var[c] = m2 / (g.count - 1);
  }
  return g;
}

Tensor on_device_like(const std::vector<double>& values, const Tensor& like) {
  return from_vector<double>(values, {static_cast<int64_t>(values.size())}).to(like.dtype()).to(like.device());
}

class ProcessGroupSync final : public nn::BatchNormSync {
 public:
  explicit ProcessGroupSync(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
    LOOM_CHECK(comm_ != nullptr, "SyncBatchNorm: the process group (communicator) is null; create one with "
               "init_process_group first and pass distributed::default_group()");
  }
  Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                    const Tensor& bias, double momentum, double eps) override {
    return sync_batch_norm(input, running_mean, running_var, weight, bias, momentum, eps, *comm_);
  }
  std::string describe() const override {
    return detail::str(comm_->backend(), ", world_size=", comm_->size());
  }

 private:
  std::shared_ptr<Communicator> comm_;
};

}  // namespace

Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps, Communicator& comm) {
  LOOM_CHECK(input.defined() && input.dim() >= 2, "SyncBatchNorm: expected an input of shape [N, C, ...], got ",
             input.defined() ? shape_str(input.shape()) : std::string("an undefined tensor"));
  if (comm.size() == 1)  // nothing to synchronise with: exactly BatchNorm2d, as PyTorch
    return batch_norm(input, running_mean, running_var, weight, bias, /*training=*/true, momentum, eps);

  const Tensor x = input.detach().contiguous();
  const GlobalMoments g = gather_moments(x, comm);
  if (running_mean.defined()) {  // See Note [BatchNorm statistics] in nn/batchnorm.h.
    NoGradGuard no_grad;
    Tensor rm = running_mean, rv = running_var;
    rm.mul_(1 - momentum).add_(on_device_like(g.mean, rm), momentum);
    rv.mul_(1 - momentum).add_(on_device_like(g.unbiased_var, rv), momentum);
  }

  // Normalise with the global statistics: the kernel's eval path does exactly
  // (x - mean) / sqrt(var + eps) * weight + bias with the statistics it is given.
  Tensor mean = on_device_like(g.mean, x), var = on_device_like(g.biased_var, x);
  Tensor out = empty(x.shape(), options_of(x));
  Tensor save_mean = empty(mean.shape(), options_of(x)), save_invstd = empty(mean.shape(), options_of(x));
  batch_norm_forward_kernel(x.device())(x, weight, bias, mean, var, /*training=*/false, 0.0, eps,
                                        /*residual=*/Tensor(), /*relu=*/false, out, save_mean, save_invstd);
  if (!any_requires_grad({input, weight, bias})) return out;

  const double count = g.count;
  Communicator* group = &comm;
  record("SyncBatchNormBackward", {input, weight, bias}, {out},
         [x_ = SavedTensor(x, "SyncBatchNormBackward"), w_ = SavedTensor(weight, "SyncBatchNormBackward"),
          save_mean, save_invstd, count, group, rx = input.requires_grad(),
          rw = weight.defined() && weight.requires_grad(),
          rb = bias.defined() && bias.requires_grad()](const std::vector<Tensor>& grads) {
           const Tensor& dy = grads[0];
           const Tensor& x = x_.get();
           const Tensor& weight = w_.get();
           // Local pieces first: the eval-mode kernel gives dy * invstd * w and this rank's
           // sum(dy * xhat) (grad_weight) and sum(dy) (grad_bias).
           Tensor dx = empty(x.shape(), options_of(x));
           Tensor local_dot = empty(save_mean.shape(), options_of(x));
           Tensor local_sum = empty(save_mean.shape(), options_of(x));
           Tensor no_residual;
           batch_norm_backward_kernel(x.device())(dy, x, weight, save_mean, save_invstd, /*training=*/false,
                                                  /*relu_out=*/Tensor(), dx, local_dot, local_sum, no_residual);
           Tensor both = cat({local_sum, local_dot});
           group->all_reduce(both, distributed::ReduceOp::Sum)->wait();  // See Note [SyncBatchNorm communication].
           if (rx) {
             // dx = w * invstd * (dy - sum(dy) / n - xhat * sum(dy * xhat) / n), with sums over
             // every rank: dx_eval + x * B + C0 per channel, B and C0 below.
             const int64_t C = save_mean.size(0);
             Tensor a = weight.defined() ? save_invstd * weight : save_invstd;
             Tensor b = -(a * save_invstd * both.narrow(0, C, C)) / count;
             Tensor c0 = -(a * both.narrow(0, 0, C)) / count - b * save_mean;
             dx = dx + x * per_channel_view(b, x) + per_channel_view(c0, x);
           }
           return std::vector<Tensor>{rx ? dx : Tensor(), rw ? local_dot : Tensor(), rb ? local_sum : Tensor()};
         });
  return out;
}

namespace nn {

std::shared_ptr<BatchNorm2d> SyncBatchNorm(int64_t num_features,
                                           std::shared_ptr<distributed::Communicator> process_group, double eps,
                                           std::optional<double> momentum, bool affine, bool track_running_stats) {
  auto bn = std::make_shared<BatchNorm2d>(num_features, eps, momentum, affine, track_running_stats);
  bn->sync = std::make_shared<ProcessGroupSync>(std::move(process_group));
  return bn;
}

size_t convert_sync_batchnorm_in_place(Module& module, std::shared_ptr<distributed::Communicator> process_group) {
  auto sync = std::make_shared<ProcessGroupSync>(std::move(process_group));
  size_t converted = 0;
  module.apply([&](Module& m) {
    if (auto* bn = dynamic_cast<BatchNorm2d*>(&m)) {
      bn->sync = sync;
      ++converted;
    }
  });
  return converted;
}

}  // namespace nn
}  // namespace loom
