// Layer-wise model parallelism: a Sequential cut into consecutive stages, stage k's
// layers living on devices[k]. Forward runs the stages in order and copies the
// activation to the next stage's device between them; backward comes back the same way
// (the copies are differentiable). One batch goes through at a time, so only one device
// works at any moment: the point is fitting a model that one device cannot hold. The
// pipeline (micro-batches in flight on every stage) is what makes the devices overlap.
//
//   auto model = nn::resnet18(10);
//   auto seq = model->sequential();                      // conv1, bn1, relu, 8 blocks, avgpool, flatten, fc
//   parallel::ModelParallel mp(seq, {"cpu:0", "cpu:1"}, {7, 7});  // 7 layers per stage
//   Tensor logits = mp(images);                          // images on cpu:0 (or anywhere), logits on cpu:1
//
//   stage 0 on cpu:0 ──activation.to(cpu:1)──► stage 1 on cpu:1 ──► output (on cpu:1)
//        ◄──────────── gradient.to(cpu:0) ─────────────── backward
//
// Note [Stage balance]
// Each stage should take about the same time, since the slowest bounds a pipeline's
// throughput, and for layer-wise model parallelism about the same memory. The split is
// a list of layer counts (torchgpipe's `balance`). balance_by_cost() computes one from a
// cost per layer (contiguous groups whose largest total is as small as possible);
// balance_by_time() measures each layer's forward and backward on a sample batch and
// balances that. Parameter counts would be the wrong cost for ResNet18: its last
// residual stage (layer4) holds 75% of the parameters but about a quarter of the work.
#pragma once

#include <memory>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/container.h"

namespace loom::parallel {

// Splits costs[0..n) into `stages` contiguous, non-empty groups whose largest sum is as
// small as possible (ties: earlier stages take fewer layers); returns each group's size.
// A loom::Error if there are fewer layers than stages.
std::vector<int64_t> balance_by_cost(const std::vector<double>& costs, int64_t stages);

// balance_by_cost over each layer's measured forward + backward time on `sample` (the
// fastest of `repeats` runs after one warm-up: on a shared machine noise only adds time),
// on the device where the module is. The module is left as it was.
std::vector<int64_t> balance_by_time(nn::Sequential& module, const Tensor& sample, int64_t stages, int repeats = 5);

// The layers of `module` in groups of balance[k] consecutive layers: new Sequentials that
// share the layers (and so their parameters) with `module`.
std::vector<std::shared_ptr<nn::Sequential>> split_module(const nn::Sequential& module,
                                                          const std::vector<int64_t>& balance);

class ModelParallel : public nn::Module {
 public:
  // Moves stage k's layers to devices[k] (in place: the layers are shared with `module`,
  // and through it with a model it came from, such as ResNet::sequential()).
  ModelParallel(std::shared_ptr<nn::Sequential> module, std::vector<Device> devices, std::vector<int64_t> balance);

  // The input moves to the first stage's device; the output stays on the last one's.
  Tensor forward(const Tensor& input) override;

  const std::vector<std::shared_ptr<nn::Sequential>>& stages() const { return stages_; }
  const std::vector<Device>& devices() const { return devices_; }
  const std::vector<int64_t>& balance() const { return balance_; }
  std::string extra_repr() const override;

 protected:
  // For subclasses (Pipeline): their own type name in printing and messages.
  ModelParallel(std::string name, std::shared_ptr<nn::Sequential> module, std::vector<Device> devices,
                std::vector<int64_t> balance);

 private:
  std::shared_ptr<nn::Sequential> module_;
  std::vector<Device> devices_;
  std::vector<int64_t> balance_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
};

}  // namespace loom::parallel
