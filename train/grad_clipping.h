// --clip-grad-norm MAX: torch.nn.utils.clip_grad_norm_ over the whole model's gradients,
// whichever way the parallel dimensions cut them (Note [Clipping sharded gradients],
// nn/optim/clip_grad.h).
//
//   loss.backward();
//   GradClipper clipper(parallel, optimizer, /*max_norm=*/1.0);  // once
//   clipper.clip(amp);                                                        // every step, every rank
//   optimizer.step();
//
// Note [Whose gradients a rank adds to the norm]
// Each rank adds the squares of the gradients it steps, and the sum runs over the ranks that
// hold different parts of the model: the stages (pp), FSDP's shards (dp_shard) and the
// tensor-parallel ranks (tp); never over dp_replicate, whose replicas hold the same averaged
// gradients. A tensor the plan left whole is on every tp rank alike, so only tp rank 0 adds
// it. The sum is an all-reduce along each of those mesh dimensions in turn, the square root
// of the result is the same norm on every rank, and every rank scales its gradients by
// min(1, max / (norm + 1e-6)), as one process clipping the whole model would.
// Under --amp fp16 the gradients are unscaled first (GradScaler::unscale_), as PyTorch's
// recipe. FSDP over tensor-parallel shards mixes split and whole tensors in one flat
// shard, so that one composition is refused.
#pragma once

#include <memory>
#include <vector>

#include "train/mixed_precision.h"  // defines: MixedPrecision
#include "train/parallel_model.h"   // defines: ParallelModel, GradNormTerms
#include "nn/optim/optimizer.h"              // defines: Optimizer

namespace loom::training {

// Clips the gradients of the parameters `optimizer` steps to a whole-model 2-norm of at
// most `max_norm`. What a rank adds to the norm and the groups the sum runs over are fixed
// by the cut, so the constructor asks the ParallelModel once (ParallelModel::grad_norm_terms,
// which refuses FSDP1's flat shards over tp); clip() is then a collective over the mesh's pp,
// dp_shard and tp groups (those enabled) every step.
class GradClipper {
 public:
  GradClipper(const ParallelModel& parallel, optim::Optimizer& optimizer, double max_norm);
  // Returns the norm before clipping.
  double clip(MixedPrecision& amp);

 private:
  optim::Optimizer& optimizer_;
  double max_norm_;
  std::vector<Tensor> params_;  // what the optimizer steps: scaled
  GradNormTerms terms_;         // of those, what this rank adds to the norm; the groups it sums over
};

}  // namespace loom::training
