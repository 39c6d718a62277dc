// The trainer's advice after an out-of-memory error in its first steps: which strategies
// would fit, each predicted by the memory estimator (estimate_memory.h), in this process.
//
//   train_cifar10 --device-memory-limit 300MiB ...
//   ... OutOfMemoryError: cpu:0: ... (the error as the allocator says it)
//   Predicted peak per rank of the alternatives (shape-only steps of each, in this process, ...):
//     fits       --mode fsdp --sharding-strategy full_shard   rank peaks 251.2, 251.2 MiB
//     too large  --mode ddp                                   rank peaks 331.4, 331.4 MiB
//
// Note [Advice after an out-of-memory error]
// An OutOfMemoryError in the first two steps (the second is the first with the optimizer's
// state, and often the peak), or while the model is being set up, is reported with the
// predicted peak of the strategies that could take its place, under the same settings and
// budget: DDP, ZeRO-1, FSDP's shard_grad_op and full_shard and a pipeline over as many
// ranks (at least 2), and the same strategy at half the batch. Each alternative is the
// run's own TrainConfig with its parallel section replaced (or its batch halved), and is
// estimated in this process: its ranks are threads, each with a World over one store made
// for it (Distributed's world), each training on CPU virtual devices of its own, from cpu:32
// and past every device the failed run holds (its memory is still allocated: under a
// process group the failed trainer cannot be torn down without the other ranks). Every
// rank's figures are its own devices', as in a run of processes, and each alternative
// starts from an empty allocator cache, as a fresh process does: blocks an earlier
// alternative left cached would serve its requests by best fit and change its peak
// (ResNet18 at batch 16: 248 MiB instead of 224). So measured, each alternative's figures
// are those of train_cifar10 --estimate-memory under loomrun, to 0.2 MiB (tested). The
// shape-only switch is the process's, so the advice runs alone in it: the failed run's
// training has stopped, and the rank threads meet in a barrier before any turns it on. On
// a GPU nothing is estimated (CPU devices' kernels and allocator are not the GPU's); the
// advice says to compare under loomrun there. Under loomrun the first failing rank (a
// counter in the job's store) gives the advice; others that failed wait for it, so that
// their exit does not make loomrun stop it; ranks that did not fail wait in their
// collectives until it exits, and loomrun then stops them (Note [How loomrun stops a
// job]). LOOM_OOM_ADVICE=0 leaves the error as it is (a benchmark that runs into the budget
// on purpose wants the error, not the estimates after each).
#pragma once

#include <string>

#include "core/memory.h"     // defines: OutOfMemoryError
#include "train/trainer.h"   // defines: TrainConfig

namespace loom::training {

// The advice's text: one line per alternative with its verdict against
// --device-memory-limit and each rank's predicted peak, or why no estimate came. `world`
// is the failed run's world size.
std::string memory_advice(const TrainConfig& config, int world);

// `error` with memory_advice appended; under loomrun one rank advises and the others
// wait for it. Never returns.
[[noreturn]] void throw_with_advice(const OutOfMemoryError& error, const TrainConfig& config);

}  // namespace loom::training
