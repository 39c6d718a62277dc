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
//
// Note [Synchronised batch statistics]
// SyncBatchNorm (parallel/sync_batch_norm.h) is a BatchNorm2d whose training statistics
// come from every rank of a process group. It is this layer with a `sync` strategy set,
// not a subclass, because convert_sync_batchnorm must convert layers that models already
// hold through typed members (BasicBlock::bn1): C++ cannot re-point those members the way
// PyTorch's setattr does, but it can change the layer they point at. Parameters, buffers,
// names and state_dict stay exactly BatchNorm2d's, so checkpoints move freely between the
// two. nn/ knows only this interface; parallel/ implements it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/module.h"

namespace loom::nn {

class BatchNormSync {
 public:
  virtual ~BatchNormSync() = default;
  // The training-mode batch_norm (same arguments and meaning as loom::batch_norm with
  // training = true), with statistics over every participating rank.
  virtual Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                            const Tensor& weight, const Tensor& bias, double momentum, double eps) = 0;
  // For printing: "gloo, world_size=2".
  virtual std::string describe() const = 0;
};

class BatchNorm2d : public Cloneable<BatchNorm2d> {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
                       bool affine = true, bool track_running_stats = true);
  void reset() override;
  void reset_running_stats();
  void reset_parameters();  // running stats, then weight 1 and bias 0
  Tensor forward(const Tensor& input) override;
  // relu(forward(input) + residual), residual optional, as one fused op: what a ResNet
  // block does after each BatchNorm (Note [Fused BatchNorm epilogue] in autograd/ops/nn.cpp).
  Tensor forward_relu(const Tensor& input, const Tensor& residual = Tensor());
  std::string extra_repr() const override;

  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;
  Tensor weight, bias;                                      // undefined unless affine
  Tensor running_mean, running_var, num_batches_tracked;   // undefined unless tracking
  // Null for a plain BatchNorm2d; see Note [Synchronised batch statistics]. Copied by clone().
  std::shared_ptr<BatchNormSync> sync;

 private:
  // Checks the input, counts the batch and returns the running-statistics momentum.
  double prepare(const Tensor& input);
};

}  // namespace loom::nn
