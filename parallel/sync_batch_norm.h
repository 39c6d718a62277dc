// SyncBatchNorm: batch normalisation whose training statistics span every rank, as
// torch.nn.SyncBatchNorm.
//
//   auto model = nn::resnet18();
//   model = nn::convert_sync_batchnorm(model, comm);   // every BatchNorm2d, in place
//   ddp::DistributedDataParallel ddp(model, comm);     // then wrap, as in PyTorch
//
//   auto bn = nn::SyncBatchNorm(64, comm);             // or build one directly
//
// With DDP each rank sees B images, so a plain BatchNorm2d normalises with statistics of
// B images and every rank's running_mean drifts its own way. SyncBatchNorm normalises
// with the statistics of all R*B images: the forward and the gradients are those of one
// BatchNorm2d on the union batch (the transparency test checks exactly this), and every
// rank's running statistics are the same. In eval mode it is a plain BatchNorm2d.
//
// Note [SyncBatchNorm communication]
// Forward, training: each rank computes per channel its count n_r, mean m_r and centred
// sum of squares M2_r, and one all_gather shares them; every rank then combines them the
// same way (Chan's parallel formula: mean = sum n_r m_r / n, M2 = sum M2_r + n_r (m_r -
// mean)^2). This is the (sum, sum of squares, count) reduction in a form that does not
// cancel when |mean| >> std: summing raw squares and subtracting mean^2 loses every digit
// of a small variance. running_var gets the unbiased M2 / (n - 1) of the whole batch.
// Backward: the input gradient needs sum(dy) and sum(dy * xhat) per channel over the
// whole batch: one all_reduce of both. weight and bias get this rank's own sums, as in
// PyTorch: DDP then averages them across ranks like any other parameter gradient.
// These collectives block the calling thread and run on the same communicator as DDP's
// buckets, after any bucket already launched: every rank issues them in the same order
// because every rank runs the same forward and backward.
//
// See Note [Synchronised batch statistics] in nn/batchnorm.h for why a SyncBatchNorm is a
// BatchNorm2d with a `sync` strategy rather than a class of its own.
#pragma once

#include <memory>
#include <optional>

#include "nn/batchnorm.h"
#include "parallel/comm/communicator.h"

namespace loom {

// The differentiable function behind SyncBatchNorm's training forward (PyTorch's
// torch.nn.modules._functions.SyncBatchNorm): loom::batch_norm(training = true) with
// statistics over every rank of `comm`. Every rank must call it, with the same channels.
Tensor sync_batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, double momentum, double eps,
                       distributed::Communicator& comm);

namespace nn {

// A BatchNorm2d whose training statistics span every rank of `process_group`.
std::shared_ptr<BatchNorm2d> SyncBatchNorm(int64_t num_features,
                                           std::shared_ptr<distributed::Communicator> process_group,
                                           double eps = 1e-5, std::optional<double> momentum = 0.1,
                                           bool affine = true, bool track_running_stats = true);

// Turns every BatchNorm2d in the tree into a SyncBatchNorm over `process_group`, in place:
// the same layers, parameters and buffers (values, identity and state_dict keys), so
// optimizers and checkpoints made before still apply. Returns how many it converted.
size_t convert_sync_batchnorm_in_place(Module& module, std::shared_ptr<distributed::Communicator> process_group);

// PyTorch's spelling: model = convert_sync_batchnorm(model, process_group).
template <typename M>
std::shared_ptr<M> convert_sync_batchnorm(std::shared_ptr<M> module,
                                          std::shared_ptr<distributed::Communicator> process_group) {
  convert_sync_batchnorm_in_place(*module, std::move(process_group));
  return module;
}

}  // namespace nn
}  // namespace loom
