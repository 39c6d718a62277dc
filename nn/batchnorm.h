// BatchNorm2d: per-channel normalisation of NCHW input, as torch.nn.BatchNorm2d.
//
//   auto bn = std::make_shared<nn::BatchNorm2d>(64);
//   Tensor y = bn->forward(x);   // training: batch statistics, running stats updated
//   bn->eval();
//   y = bn->forward(x);          // eval: running statistics
//
// Parameters weight (gamma, 1s) and bias (beta, 0s) when affine; buffers running_mean
// (0s), running_var (1s) and num_batches_tracked (int64 0) when track_running_stats.
//
// Note [BatchNorm statistics]
// Training normalises with the batch's biased variance (divide by N*H*W) but folds the
// *unbiased* variance (divide by N*H*W - 1) into running_var:
//   running = (1 - momentum) * running + momentum * batch_statistic.
// With momentum = nullopt the update is a cumulative average instead: momentum is
// 1 / num_batches_tracked. Both exactly as PyTorch; the arithmetic is in the
// batch_norm op (autograd/ops.h), this layer only chooses the factor and counts batches.
#pragma once

#include <optional>

#include "nn/module.h"

namespace loom::nn {

class BatchNorm2d : public Cloneable<BatchNorm2d> {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
  void reset() override;
  void reset_running_stats();
  void reset_parameters();  // running stats, then weight 1 and bias 0
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;
  Tensor weight, bias;                                      // undefined unless affine
  Tensor running_mean, running_var, num_batches_tracked;   // undefined unless tracking
};

}  // namespace loom::nn
