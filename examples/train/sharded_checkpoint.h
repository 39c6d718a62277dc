// train_cifar10's sharded checkpoints: under --mode fsdp or --zero-redundancy-optimizer,
// each rank writes the state it holds, and nothing is gathered onto rank 0.
//
// Note [Sharded checkpoints in train_cifar10]
// --checkpoint-format names PyTorch's StateDictType:
//   full     (FULL_STATE_DICT)    every rank gathers, rank 0 writes <dir>/checkpoint.safetensors
//                                 (Note [What a checkpoint holds], checkpoint.h); loads at any
//                                 world size, and in one process.
//   sharded  (SHARDED_STATE_DICT) every rank writes <dir>/step-<N>/shard-<rank>-of-<world>.safetensors,
//                                 then rank 0 the manifest, last (Note [The manifest is written
//                                 last], parallel/distributed_checkpoint.h).
// The default is sharded where the ranks hold different state (FSDP, ZeRO-1, a pipeline's
// stages: Checkpointer, checkpointer.h) and full elsewhere. A shard file is a full
// checkpoint's file with this rank's part of the model and optimizer state:
//   fsdp   model.flat_param_<k> (this rank's shards) and model.<buffer>; optimizer.* is the
//          SGD over the shards' own state (shard-shaped momentum); fsdp.* metadata: the cut
//          (parallel/fsdp/sharded_state_dict.h). Under --pp, each of the stage's chunks
//          likewise under model.virtual_stage<c>.* and virtual_stage<c>.fsdp.*
//   ZeRO-1 model.* whole (it is replicated: each rank keeps its own copy, buffers included),
//          optimizer.* this rank's partition (Note [ZeRO's sharded state])
//   --pp   model.* whole, of which this rank's stage's chunks are the ones it trains (the
//          others are whatever it last received), optimizer.* its stage's SGD
// and, in every shard, the scheduler, scaler, this rank's generator and the position. A
// resume loads each rank's own shard from the newest complete step directory, after
// checking that the world size, the strategy and the layout are the ones that wrote it
// (resharding is not supported: the error says so and names both).
#pragma once

#include <string>

#include "examples/train/checkpoint.h"   // defines: TrainingPosition, CheckpointState
#include "examples/train/distributed.h"  // defines: Distributed (rank, world, barrier)
#include "examples/train/trainer.h"      // defines: TrainConfig
#include "examples/train/parallelize.h"  // defines: ParallelModel (its sharded parts)

namespace loom::examples {

// Every rank (a collective: barriers): writes its shard of <dir>/step-<global step>, then
// rank 0 the manifest, then rank 0 removes older step directories but the newest complete
// one. The model's state is its FSDP parts' shards, each under its prefix (one part and
// no prefix without --pp; "virtual_stage<c>." per virtual stage of a stage), or without FSDP the
// model's own state dict (ZeRO-1, --pp).
void save_sharded_checkpoint(const std::string& dir, const Distributed& dist, const ParallelModel& parallel,
                             const optim::Optimizer& optimizer,
                             const optim::LRScheduler* scheduler, const TrainingPosition& position,
                             const optim::GradScaler* scaler);

// Every rank: its own shard of the complete `step_dir` into model and optimizer (and
// scheduler, scaler, generator, as load_checkpoint); returns the position. A loom::Error
// naming what the checkpoint was written for when this run's world size, strategy or
// layout differ. Not collective.
TrainingPosition load_sharded_checkpoint(const std::string& step_dir, const Distributed& dist,
                                         const ParallelModel& parallel, optim::Optimizer& optimizer, optim::LRScheduler* scheduler,
                                         optim::GradScaler* scaler);

// A first start under the sharded format: rank 0 removes an earlier run's step
// directories, so that a restart before this run's first checkpoint cannot resume from
// them (Note [Resuming after a restart]). Returns how many it removed.
int clear_sharded_checkpoints(const std::string& dir);

}  // namespace loom::examples
