// train_cifar10's sharded checkpoints: each rank writes the pieces of the model's tensors
// it holds, nothing is gathered onto rank 0, and any other layout resumes from them.
//
// Note [Sharded checkpoints in train_cifar10]
// --checkpoint-format names PyTorch's StateDictType:
//   full     (FULL_STATE_DICT)    every rank gathers, rank 0 writes <dir>/checkpoint.safetensors
//                                 (Note [What a checkpoint holds], checkpoint.h); loads at any
//                                 world size, and in one process.
//   sharded  every rank writes <dir>/step-<N>/shard-<rank>-of-<world>.safetensors, then rank 0
//            the manifest, last (Note [The manifest is written last], parallel/distributed_checkpoint.h).
// The default is sharded where the ranks hold different state (FSDP, ZeRO-1, TP, a pipeline's
// stages: Checkpointer, checkpointer.h) and full elsewhere; sharded works everywhere but the
// in-process multi-device modes. A shard file holds, as torch.distributed.checkpoint's do,
// pieces of the plain model's tensors under the single-process names, each with its global
// shape and offsets (Note [Saved pieces], parallel/checkpoint/sharded_state.h):
//   FSDP1    each unit's flat shard as boxes of the parameters it slices (fsdp_state.h)
//   FSDP2    each parameter's rows
//   --tp     each split tensor's tp part; --pp: the stage's own tensors only; DDP: rank 0's
//   buffers  whole, written by the first rank that holds them
//   optim.*  the optimizer state beside its parameter's pieces, by name (Note [Optimizer state
//            by name], parallel/checkpoint/optimizer_state.h): ZeRO-1's owner writes its own
// and, outside the pieces, the scheduler, scaler, this rank's generator and the position,
// and the layout that wrote it ("layout": ParallelDims::str()). A resume describes what this
// run's rank holds the same way and fills it from every file that overlaps it
// (parallel/checkpoint/load_plan.h), so a set saved under --dp-shard 4 continues under --tp 2,
// --pp 2 x --dp-shard 2 or in one process, and says "resharded step 12 from <layout> (4
// files) into <layout>". The scheduler, scaler and position come from rank 0's file, and
// the generator from this rank's own when the world size is the one that wrote it (else
// from rank 0's: generators are per rank, and another world has other ranks).
#pragma once

#include <string>
#include <vector>

#include "train/checkpoint.h"   // defines: TrainingPosition, CheckpointState
#include "train/distributed.h"  // defines: Distributed (rank, world, barrier)
#include "train/trainer.h"      // defines: TrainConfig
#include "train/optimizer.h"    // defines: BuiltOptimizer
#include "train/parallel_model.h"  // defines: ParallelModel (local_state: this rank's boxes)

namespace loom::training {

// Every rank (a collective: barriers): writes its shard of <dir>/step-<global step>, then
// rank 0 the manifest, then rank 0 removes older step directories but the newest complete
// one. See Note [Sharded checkpoints in train_cifar10].
void save_sharded_checkpoint(const std::string& dir, const Distributed& dist, const ParallelModel& parallel,
                             const BuiltOptimizer& optimizer,
                             const optim::LRScheduler* scheduler, const TrainingPosition& position,
                             const optim::GradScaler* scaler);

// Every rank: its part of the model and optimizer state from the complete `step_dir`,
// whatever layout wrote it, and the scheduler, scaler and generator (as read_checkpoint);
// returns the position. A loom::Error naming the tensor when the set does not cover it or
// holds another shape of it (another model). Not collective.
TrainingPosition load_sharded_checkpoint(const std::string& step_dir, const Distributed& dist,
                                         const ParallelModel& parallel, const BuiltOptimizer& optimizer,
                                         optim::LRScheduler* scheduler,
                                         optim::GradScaler* scaler);

// A full checkpoint file (Note [What a checkpoint holds], checkpoint.h) into a layout whose
// ranks hold pieces of the model (--pp, --tp: Note [Resuming either format]): the file is
// read as a one-file sharded set, its tensors whole pieces and its optimizer state renamed
// from one process's numbering to the parameters' names (Note [Optimizer state by name]),
// and each rank takes its pieces as from any set. `numbered_names`: the parameter names
// in the numbering of the optimizer that wrote the file (one process's). Not collective.
TrainingPosition load_full_checkpoint_as_pieces(const std::string& path, const ParallelModel& parallel,
                                                const BuiltOptimizer& optimizer,
                                                const std::vector<std::string>& numbered_names,
                                                optim::LRScheduler* scheduler, optim::GradScaler* scaler);

}  // namespace loom::training
