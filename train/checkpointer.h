// Checkpointer: the trainer's one object for saving and resuming, whatever the parts
// of the model are (torchtitan's CheckpointManager). The loop says when; this decides how:
//
//   Checkpointer checkpointer(config, dist, parallel, optimizer, scheduler, &scaler);
//   TrainingPosition at = checkpointer.resume();   // --resume or a restart; else the start
//   ... checkpointer.save(at);                     // a collective, every rank
//   checkpointer.save_weights(config.checkpoint.save);   // --save: the whole model, one file
//
// What each rank holds decides the format (Note [Sharded checkpoints in train_cifar10],
// sharded_checkpoint.h):
//   sharded (a file per rank + a manifest): the default wherever ranks hold different
//     state: FSDP's shards (--dp-shard), ZeRO-1's optimizer partitions, a pipeline's
//     stages (--pp: each rank its stage's parameters and optimizer state), and their
//     compositions;
//   full (one file, gathered on rank 0): the default elsewhere; under FSDP and ZeRO-1 on
//     request (--checkpoint-format full). Not under --pp, whose stages' optimizer states are
//     never gathered onto one rank.
#pragma once

#include <string>

#include "nn/optim/lookahead.h"  // defines: Lookahead (its average is training state)

#include "train/checkpoint.h"   // defines: TrainingPosition
#include "train/distributed.h"  // defines: Distributed
#include "train/optimizer.h"    // defines: BuiltOptimizer
#include "train/parallel_model.h"  // defines: ParallelModel (full and local state)
#include "train/trainer.h"      // defines: TrainConfig

namespace loom::training {

class Checkpointer {
 public:
  // Resolves --checkpoint-format against what is sharded: a loom::Error naming the flag
  // when the asked format cannot hold this run's state.
  // `lookahead` (--lookahead-every; may be null): its average is saved beside the model's
  // state, in the full format only (Note [Lookahead in a checkpoint]).
  Checkpointer(const TrainConfig& config, const Distributed& dist, ParallelModel& parallel,
               const BuiltOptimizer& optimizer, optim::LRScheduler* scheduler, optim::GradScaler* scaler,
               optim::Lookahead* lookahead = nullptr);

  bool sharded() const { return sharded_; }

  // Where to continue from: under --resume, or after loomrun restarted the job (Note
  // [Resuming after a restart]), the newest complete checkpoint's position, of either
  // format whichever this run writes (Note [Resuming either format], checkpoint.h), with
  // every rank's state loaded from it; else the start (and an earlier run's checkpoints
  // removed, so that a restart cannot resume from them).
  TrainingPosition resume();

  // Saves the training state at `at` under --checkpoint-dir (nothing without one). A
  // collective: every rank calls it at the same point; it ends with a barrier.
  void save(const TrainingPosition& at);

  // --save PATH: the whole model's weights (the model's own keys), written by rank 0 after
  // a pipeline's stages are shared or FSDP's shards gathered. A collective; "" does nothing.
  void save_weights(const std::string& path);

 private:
  const TrainConfig& config_;
  const Distributed& dist_;
  ParallelModel& parallel_;
  const BuiltOptimizer& built_;
  optim::LRScheduler* scheduler_;
  optim::GradScaler* scaler_;
  optim::Lookahead* lookahead_;
  bool sharded_ = false;
};

}  // namespace loom::training
