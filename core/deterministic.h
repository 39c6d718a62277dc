// loom::use_deterministic_algorithms: PyTorch's torch.use_deterministic_algorithms, the one
// switch that makes "the same command trains the same model" a guarantee rather than a default.
//
//   loom::use_deterministic_algorithms(true);       // train_cifar10 --deterministic
//   ...
//   loom::alert_not_deterministic("index_add on CUDA");   // in an op that cannot promise it
//
// Note [Same command, same model]
// By default every loom program trains bitwise the same weights when run twice with the
// same flags, in every parallel mode: the data order and augmentation are keyed by (seed,
// epoch, index) (Note [Per-sample randomness]), collectives sum in a fixed order, and every
// kernel is chosen by fixed rules. Two things can break it, and both are opt-in:
// - a choice made by timing: the CPU kernel search (backends::cpu::benchmark,
//   `--conv-benchmark on`, as cudnn.benchmark) and a pipeline cut by measured layer times
//   (`--balance time`). The timings depend on what else the machine is doing, so two runs
//   can pick different algorithms, which round differently. A search's choices replayed
//   from a cache file (`--conv-benchmark-cache FILE` alone) are fixed, and so reproducible.
// - a kernel whose floating-point sums depend on thread timing: CUDA's atomicAdd scatters
//   (index_add, scatter_add, max-pooling's backward), where positions collide.
// With use_deterministic_algorithms(true), each of these raises a loom::Error naming itself
// (alert_not_deterministic) instead of running, as PyTorch raises for its nondeterministic
// ops; nothing else changes, so a run that passes with the switch on trained exactly what it
// trains with it off. docs/reproducibility.md lists what it rules out.
#pragma once

#include <string>

namespace loom {

// On: operations that would make two runs differ raise instead (Note [Same command, same
// model]). Off (the default): they run where they are asked for.
void use_deterministic_algorithms(bool mode);
bool are_deterministic_algorithms_enabled();

// A loom::Error saying that `caller` has no deterministic implementation, if the switch is
// on; nothing otherwise. `instead`: what to do instead ("drop --conv-benchmark on"), may be empty.
void alert_not_deterministic(const std::string& caller, const std::string& instead = "");

}  // namespace loom
