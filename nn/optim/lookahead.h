// Lookahead: a slow copy of a model's whole state that the live weights are pulled back to
// every few steps (Zhang et al. 2019, "Lookahead Optimizer: k steps forward, 1 step back"),
// in the form the CIFAR-10 speedruns use: an exponential moving average over *every* floating
// state_dict entry, BatchNorm's running statistics included, that is copied back into the model.
//
//   optim::Lookahead lookahead(*model);              // the average starts at the model's state
//   for (int64_t step = 1; step <= steps; ++step) {
//     ...; optimizer.step();
//     if (step % 5 == 0) lookahead.update(0.95 * ...);   // average <- lerp(average, model, 1 - decay);
//   }                                                     // model   <- average
//   lookahead.update(1.0);                           // at the end: the model takes the average
//
// PyTorch has no class of this name in torch.optim; the nearest is swa_utils.AveragedModel
// with an EMA avg_fn and use_buffers=True, which keeps the average in a second model. Here the
// average is written back into the live model each time (the "one step back"), which is what
// makes it Lookahead rather than a plain EMA: the optimizer continues from the averaged point.
//
// Note [Lookahead averages buffers]
// The running mean and variance of BatchNorm are averaged with the weights, not recomputed:
// statistics collected under weights the average has since moved away from would not match
// the weights the model ends with. Integer entries (num_batches_tracked) are not averaged and
// keep the model's value. The per-element update is PyTorch's lerp_ (two formulas, chosen by
// whether the weight is below 1/2, so that weight 1 gives `end` exactly), so a run agrees with
// torch's `average.lerp_(model, 1 - decay)` to the last bit.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"      // defines: Module
#include "nn/ordered_dict.h"

namespace loom::optim {

class Lookahead {
 public:
  // Takes a copy of every floating state_dict entry of `model` as the initial average. The
  // model must outlive this object and keep its structure (the same state_dict entries).
  explicit Lookahead(nn::Module& model);

  // average = lerp(average, model, 1 - decay), then model = average (under NoGradGuard).
  // decay in [0, 1]: 0 leaves the model as it is (and sets the average to it), 1 copies the
  // average into the model.
  void update(double decay);

  // The average, named as the model's state_dict (for saving beside a checkpoint).
  OrderedDict<Tensor> state_dict() const;
  void load_state_dict(const OrderedDict<Tensor>& state);

 private:
  nn::Module& model_;
  std::vector<std::string> names_;  // the floating entries of the model's state_dict, in order
  std::vector<Tensor> average_;
};

// lerp_ of PyTorch, elementwise: start += weight * (end - start), as
// weight < 0.5 ? start + weight * (end - start) : end - (end - start) * (1 - weight).
// Same shape, dtype and device; start is written in place.
void lerp_(Tensor& start, const Tensor& end, double weight);

}  // namespace loom::optim
