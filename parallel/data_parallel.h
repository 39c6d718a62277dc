// DataParallel: one process drives several devices, as torch.nn.DataParallel. Every
// forward splits the batch over the devices, copies the module to each, runs the copies
// on one thread per device, and gathers the outputs on the output device; backward
// sends the gradients back along the same way and sums them into the module's own
// parameters.
//
//   auto net = nn::resnet18(10);                           // on cpu:0 (or cuda:0)
//   auto dp = std::make_shared<parallel::DataParallel>(net, std::vector<Device>{"cpu:0", "cpu:1"});
//   Tensor loss = criterion((*dp)(images), labels);        // images: the whole batch, on cpu:0
//   loss.backward();                                       // net's .grad(): the whole batch's
//   optimizer.step();                                      // an optimizer over net->parameters()
//
// One forward, on devices d0 (where the module lives), d1, ...:
//
//   input ──scatter──► chunk 0 on d0 ──► module itself   ─┐
//         (chunk+to)   chunk 1 on d1 ──► replica on d1  ──┼──gather (to+cat)──► output on d0
//                      ...               (threads)        ┘
//   parameters ──replicate (to)──► replica parameters: not copies but differentiable
//                                  functions of the originals, so backward sums every
//                                  replica's gradient into the module's .grad()
//
// The pieces are public, as torch.nn.parallel's: scatter, replicate, parallel_apply,
// gather; DataParallel::forward is those four. On a machine without GPUs the devices are
// CPU virtual devices (cpu:0, cpu:1, ...): the same kernels, but every tensor knows its
// device and ops refuse to mix them, so a missing copy is an error rather than luck.
//
// Note [The replica on the first device is the module]
// PyTorch guarantees that the replica on device_ids[0] shares its parameters and
// buffers with the module, so in-place updates there (BatchNorm's running statistics)
// are kept, while those of the other replicas are lost when they are dropped after the
// forward. loom keeps the guarantee in the simplest way: the first chunk runs through
// the module itself. The other replicas get copies of the buffers taken at replication.
//
// Note [Replica parameters are functions of the parameters]
// A replica's parameter must be the *result* of copying the original (original.to(d),
// which records ToDeviceBackward), not a new leaf: then backward through the replica
// reaches the original's gradient accumulator, and the engine sums the contributions of
// every replica before accumulating once. Layers keep handles to their parameters
// (Note [Parameters keep their identity], nn/module.h), so replicate() builds the
// replica's structure (clone_structure) and then makes each of its parameter tensors
// *become* the copy: the TensorImpl takes over the copy's data and autograd record, so
// every handle the replica's layers hold sees it.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace loom::parallel {

// Splits `input` along `dim` into at most devices.size() chunks (torch.chunk's sizes) and
// moves chunk i to devices[i]; fewer chunks than devices when the batch is smaller.
// Differentiable: each chunk's gradient goes back to its slice of `input`.
std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices, int64_t dim = 0);

// One copy of `module` per device in `devices` (none of which may be the module's own;
// see Note [The replica on the first device is the module]), with parameters that are
// differentiable copies of the module's (Note [Replica parameters are functions of the
// parameters]) and buffers that are plain copies. Under NoGradGuard the parameters are
// plain copies too.
std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module, const std::vector<Device>& devices);

// outputs[i] = modules[i](inputs[i]), each on its own thread, which inherits the caller's
// grad mode and autocast state and gets its share of the caller's OpenMP threads. An
// exception in any of them is rethrown here, naming the replica and its input's device.
std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& modules,
                                   const std::vector<Tensor>& inputs);

// The tensors moved to `device` and concatenated along `dim`. Differentiable.
Tensor gather(const std::vector<Tensor>& outputs, Device device, int64_t dim = 0);

class DataParallel : public nn::Module {
 public:
  // device_ids: the devices to use, the first holding `module` (every parameter and
  // buffer); empty means every CUDA device, or, without CUDA, running the module as is
  // (as PyTorch). output_device: where forward's output goes (default device_ids[0]).
  // dim: the dimension split into chunks (the batch).
  DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> device_ids = {},
               std::optional<Device> output_device = std::nullopt, int64_t dim = 0);

  Tensor forward(const Tensor& input) override;

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::vector<Device>& device_ids() const { return device_ids_; }
  Device output_device() const { return output_device_; }
  std::string extra_repr() const override;

 private:
  void check_module_device() const;

  std::shared_ptr<nn::Module> module_;
  std::vector<Device> device_ids_;
  Device output_device_;
  int64_t dim_;
};

}  // namespace loom::parallel
