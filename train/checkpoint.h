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
// checkpoint was written starts from scratch, as the first attempt did (a first start
// removes an earlier run's checkpoints, of either format, for this reason). Only a
// complete checkpoint is ever seen: rank 0 writes it to a temporary file, syncs it, and
// renames it into place, so a rank killed mid-save leaves the previous one; a sharded one
// is complete when its manifest vouches for every shard (Note [The manifest is written
// last], parallel/distributed_checkpoint.h). D must be the same
// directory for every rank (a shared file system on several nodes); the trainer checks
// that all ranks agree on resuming.
#pragma once

#include <cstdint>
#include <string>

#include "train/progress.h"
#include "nn/module.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/optimizer.h"
#include "nn/safetensors.h"  // defines: safetensors::File, Metadata

namespace loom::training {

// The entries of `part` into `out`, each name under `prefix` ("model." + "conv1.weight").
template <typename V>
void add_prefixed(OrderedDict<V>& out, const std::string& prefix, const OrderedDict<V>& part) {
  for (const auto& [name, value] : part) out.insert(prefix + name, value);
}

// The entries of `all` whose names start with `prefix`, without it.
template <typename V>
OrderedDict<V> take_prefixed(const OrderedDict<V>& all, const std::string& prefix) {
  OrderedDict<V> part;
  for (const auto& [name, value] : all)
    if (name.rfind(prefix, 0) == 0) part.insert(name.substr(prefix.size()), value);
  return part;
}

struct TrainingPosition {
  int64_t epoch = 0;          // the epoch in progress (or the next one, at an epoch boundary)
  int64_t step_in_epoch = 0;  // optimizer steps already taken in that epoch
  int64_t global_step = 0;
  RunningMetrics metrics;     // of the epoch in progress
};

std::string checkpoint_path(const std::string& dir);

// Note [Resuming either format]
// --resume (and a restart) continues from whatever --checkpoint-dir holds, whichever format
// this run writes: the full checkpoint file (checkpoint_path), or the newest complete
// step directory of a sharded set (Note [Sharded checkpoints in train_cifar10],
// sharded_checkpoint.h), whatever layout wrote it. The format flag decides what this run
// writes, never what it can read: a set saved under --dp-shard 4 resumes under --mode ddp,
// a full file under --pp 2 (read as a one-file set, each rank taking its pieces). When the
// directory holds both kinds (a run of one format resumed by a run of the other), the
// later global step wins, and the run says which it took and why; at an equal step, the
// format this run writes. Which kind and where are said in the "resumed from" line.
struct CheckpointToResume {
  std::string path;          // the full checkpoint's file or the sharded set's step directory; "" for none
  bool sharded = false;      // which of the two `path` is
  int64_t global_step = -1;  // the step it was saved at
};

// What to resume from (Note [Resuming either format]): with `resume` (--resume), or when
// this process is a restart (LOOM_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT above 0),
// the newer of `dir`'s full checkpoint and its newest complete sharded step directory
// (`prefer_sharded` breaks a tie: the format this run writes); none for a first start or
// a restart with nothing complete yet. `resume` with nothing to resume is a loom::Error
// saying where it looked. With `log`, incomplete sharded checkpoints that were skipped,
// and the choice between two kinds, are said on stderr. See Note [Resuming after a restart].
CheckpointToResume checkpoint_to_resume(const std::string& dir, bool resume, bool prefer_sharded, bool log);

// A first start with --checkpoint-dir `dir`: removes an earlier run's checkpoints of
// either kind, so that a restart before this run's first checkpoint cannot resume from
// them (Note [Resuming after a restart]). Returns how many it removed.
int clear_checkpoints(const std::string& dir);

// Writes the training state (Note [What a checkpoint holds]) to checkpoint_path(dir),
// atomically; the model's and the optimizer's state are whole (ParallelModel's
// full_state_dict and full_optim_state_dict: FSDP's shards and ZeRO-1's partitions
// gathered on rank 0, which calls it).
void save_checkpoint(const std::string& dir, const OrderedDict<Tensor>& model_state,
                     const OrderedDict<Tensor>& optimizer_state, const optim::LRScheduler* scheduler,
                     const TrainingPosition& position, const optim::GradScaler* scaler = nullptr);
struct CheckpointState {
  OrderedDict<Tensor> model, optimizer;
  TrainingPosition position;
  safetensors::Metadata metadata;  // the file's: a sharded one's says which cut it belongs to
};
// Restores the scheduler, an enabled scaler (when the checkpoint has its state; else it
// keeps its initial scale) and the default generator; returns the model's and the
// optimizer's state (whole) and the position.
CheckpointState read_checkpoint(const std::string& dir, optim::LRScheduler* scheduler,
                                optim::GradScaler* scaler = nullptr);

// Both formats' file contents: the model's and the optimizer's state (whole, or this
// rank's shard) beside the scheduler's, the scaler's, the generator's and the position.
safetensors::File pack_training_state(const OrderedDict<Tensor>& model_state, const OrderedDict<Tensor>& optimizer_state,
                                      const optim::LRScheduler* scheduler, const TrainingPosition& position,
                                      const optim::GradScaler* scaler);
// The inverse; `path` names the file in errors. Restores scheduler, scaler and generator.
CheckpointState unpack_training_state(const safetensors::File& file, const std::string& path,
                                      optim::LRScheduler* scheduler, optim::GradScaler* scaler);

}  // namespace loom::training
