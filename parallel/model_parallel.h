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
// Where to cut (the balance): parallel/balance.h.
#pragma once

#include <memory>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/container.h"
#include "parallel/balance.h"  // defines: balance_by_cost_model, balance_by_time (Note [Stage balance])

namespace loom::parallel {

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
