// train_cifar10 --estimate-memory: each rank's (or, in one process, each device's) peak
// memory for the chosen strategy and degrees, predicted in seconds without training; and
// after an out-of-memory error in the first steps, the strategies that would fit (memory_advice.h).
//
//   build/examples/train_cifar10 --estimate-memory --batch-size 256
//   build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/train_cifar10
//       --mode fsdp --estimate-memory --device-memory-limit 600MiB     (one command)
//
// Note [How the memory estimate is made]
// The trainer is built as for training, for real (the data, the model's initialisation,
// its parallelized form with the ranks' agreements on cuts and shards, the optimizer: a
// second or so), and then runs its own training step, but shape-only (Note [Shape-only
// runs], core/shape_only.h): every computing kernel is skipped, every allocation is made,
// and allocations made while building count in the peak as they do in training. Two steps at
// least, so that the second has the optimizer's state; then more, up to five, until a
// step makes no system allocation, the caching allocator's steady state (Note [Caching
// allocator]): every later step allocates as that one did. The prediction is then the
// device's max_memory_allocated, the figure a training run measures, and the breakdown
// of each line is, in MiB:
//   model state    the parameters, gradients and optimizer state on the device after
//                  the last step (distinct storages: Note [Counting storages, not tensors])
//   other held     the rest of what stays allocated between steps (buffers, a batch,
//                  the data set where it lives on the training device, and what the
//                  allocator's rounding adds to the blocks of all these)
//   comm           shared-memory blocks charged at the peak beyond those held between
//                  steps: FSDP's gathered units, communication buffers made in the step
//   activations    the rest at the peak: activations, their gradients and temporaries
// The four add up to the peak. Gradients count in model state although at the peak
// (early in the backward) most do not exist yet; what they will take is then part of
// the activations' share. Evaluation (at batch 256, without gradients) is not estimated.
// No budget is applied during the estimate, so that a strategy past it is still
// measured; the line says whether the peak fits under --device-memory-limit.

#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device.h"                  // defines: Device
#include "train/distributed.h"   // defines: Distributed (ranks, all_gather)
#include "train/trainer.h"       // defines: TrainConfig, TrainResult
#include "nn/module.h"                    // defines: Module
#include "nn/optim/optimizer.h"           // defines: Optimizer

namespace loom::training {

// One device's predicted peak and its parts, in bytes. See Note [How the memory estimate is made].
struct DeviceMemoryEstimate {
  Device device;
  int64_t peak = 0;
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t held = 0;           // allocated between steps (model state included)
  int64_t communication = 0;  // shared-memory blocks at the peak beyond those held between steps
  int64_t steps = 0;          // shape-only steps it took to reach the steady state

  int64_t model_state() const { return parameters + gradients + optimizer_state; }
  int64_t other_held() const { return held - model_state(); }
  int64_t activations() const { return peak - held - communication; }
};

// The devices this process trains on: --device, and after it the others of --mode dp,
// mp or pipeline (dp_devices, mp_stages).
std::vector<Device> training_devices(Device first, const distributed::ParallelDims& dims);

// Runs `step` shape-only (the caller has turned it on) until the steady state, then
// measures each of `devices`: its peak and, from `module` and `optimizer`, its model state.
// `all_steady(mine)` says whether every rank's step was steady (a collective: the ranks
// must run as many steps, or a pipeline's stages would wait for each other forever).
std::vector<DeviceMemoryEstimate> measure_shape_only_steps(const std::vector<Device>& devices,
                                                           const std::function<void()>& step,
                                                           const std::function<bool(bool)>& all_steady,
                                                           const nn::Module& module,
                                                           const optim::Optimizer& optimizer);

// One line per rank (under loomrun, gathered to rank 0) or per device (in one process),
// printed by rank 0, with the verdict against --device-memory-limit; --metrics-json gets
// them as lists. Collective under a process group.
void report_memory_estimate(const std::vector<DeviceMemoryEstimate>& estimates, const Distributed& dist,
                            const TrainConfig& config);

// The text of one estimate line (for tests and the report).
std::string format_estimate(const std::string& where, const DeviceMemoryEstimate& e, int64_t limit);

// The estimate of `config`'s training step on this rank's devices, made by a trainer built
// for it (Note [How the memory estimate is made]), without the report. `world`: the ranks
// as threads of this process (Distributed), or null for the process's own group.
// Defined with the trainer (trainer.cpp).
std::vector<DeviceMemoryEstimate> estimate_memory_of(const TrainConfig& config, distributed::World* world);

}  // namespace loom::training
