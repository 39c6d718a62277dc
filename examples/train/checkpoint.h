// Checkpoint: the whole training state in one safetensors file, so that a resumed run
// continues exactly as an uninterrupted one would.
//
// Note [What a checkpoint holds]
// Exact resumption needs every piece of state the next step reads:
//   model.*      parameters and buffers (BatchNorm running stats, num_batches_tracked)
//   optimizer.*  momentum buffers and hyperparameters (optim's Note [Flat optimizer state])
//   scheduler.*  the LR schedule's position
//   scaler.*     the loss scale and its growth tracker (--amp fp16 only: GradScaler)
//   metadata     epoch and step within it (the data order of an epoch is a pure function
//                of (seed, epoch), so skipping the consumed batches restores the sampler
//                position), the global step, the default generator's (seed, offset),
//                and the epoch's running metrics so its summary line is unchanged.
// Saved atomically (temp file + rename): a crash mid-save leaves the previous one intact.
//
// Note [Resuming after a restart]
// Under loomrun --max-restarts (or torchrun --max-restarts) a failed group starts again
// with LOOM_RESTART_COUNT (TORCHELASTIC_RESTART_COUNT) above 0, and train_cifar10
// --checkpoint-dir D then resumes from D's checkpoint without being told: the restart
// count, not the mere presence of a checkpoint, is the signal. A first start (count 0)
// trains from scratch even when D holds an old run's checkpoint -- reusing a directory
// never silently continues a finished or unrelated run -- and --resume stays the way to
// continue by hand (after a requeue, say). A restart that happens before the first
// checkpoint was written starts from scratch, as the first attempt did. Only a complete
// checkpoint is ever seen: rank 0 writes it to a temporary file, syncs it, and renames
// it into place, so a rank killed mid-save leaves the previous one. D must be the same
// directory for every rank (a shared file system on several nodes); the trainer checks
// that all ranks agree on resuming.
#pragma once

#include <cstdint>
#include <string>

#include "examples/train/progress.h"
#include "nn/module.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/optimizer.h"

namespace loom::examples {

struct TrainingPosition {
  int64_t epoch = 0;          // the epoch in progress (or the next one, at an epoch boundary)
  int64_t step_in_epoch = 0;  // optimizer steps already taken in that epoch
  int64_t global_step = 0;
  RunningMetrics metrics;     // of the epoch in progress
};

std::string checkpoint_path(const std::string& dir);

// True when this process is a restart (LOOM_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT
// above 0) and `dir` holds a complete checkpoint. See Note [Resuming after a restart].
bool resume_after_restart(const std::string& dir);

void save_checkpoint(const std::string& dir, const nn::Module& model, const optim::Optimizer& optimizer,
                     const optim::LRScheduler* scheduler, const TrainingPosition& position,
                     const optim::GradScaler* scaler = nullptr);

// Restores model, optimizer, scheduler, an enabled scaler (when the checkpoint has its
// state; else it keeps its initial scale) and the default generator; returns the position.
TrainingPosition load_checkpoint(const std::string& dir, nn::Module& model, optim::Optimizer& optimizer,
                                 optim::LRScheduler* scheduler, optim::GradScaler* scaler = nullptr);

// The same two steps with the model's and the optimizer's state as dicts, for a caller
// that makes and loads them itself: --mode fsdp consolidates its sharded state on rank 0
// and gives each rank its shard back (parallel/fsdp/state_dict.h).
void save_checkpoint(const std::string& dir, const OrderedDict<Tensor>& model_state,
                     const OrderedDict<Tensor>& optimizer_state, const optim::LRScheduler* scheduler,
                     const TrainingPosition& position, const optim::GradScaler* scaler = nullptr);
struct CheckpointState {
  OrderedDict<Tensor> model, optimizer;
  TrainingPosition position;
};
// Restores scheduler, scaler and generator as load_checkpoint does; returns the rest.
CheckpointState read_checkpoint(const std::string& dir, optim::LRScheduler* scheduler,
                                optim::GradScaler* scaler = nullptr);

}  // namespace loom::examples
