#include "train/sharded_checkpoint.h"

#include <cstdio>

#include "core/error.h"
#include "train/optimizer.h"              // defines: BuiltOptimizer (ZeRO-1's partition)
#include "parallel/checkpoint/load_plan.h"         // defines: read_checkpoint_index, load
#include "parallel/checkpoint/optimizer_state.h"   // defines: optimizer_pieces, load_optimizer_state
#include "parallel/distributed_checkpoint.h"       // defines: write_shard, write_manifest
#include "parallel/zero_redundancy_optimizer.h"    // defines: ZeroRedundancyOptimizer::local_optimizer

namespace loom::training {
namespace ckpt = distributed::checkpoint;

namespace {

// The metadata key of the layout that wrote a sharded checkpoint, for the resume's message.
constexpr const char* kLayout = "layout";

}  // namespace

void save_sharded_checkpoint(const std::string& dir, const Distributed& dist, const ParallelModel& parallel,
                             const BuiltOptimizer& optimizer, const optim::LRScheduler* scheduler,
                             const TrainingPosition& position, const optim::GradScaler* scaler) {
  LocalState mine = parallel.local_state();
  ckpt::ShardedState state = mine.model;
  if (const optim::Optimizer* local = optimizer.local())
    for (ckpt::LocalTensor& t : ckpt::optimizer_pieces(*local, mine.params, optimizer.zero_redundancy != nullptr,
                                                       dist.is_main()))
      state.push_back(std::move(t));
  safetensors::File file = ckpt::pack(state);
  // Beside the pieces: the scheduler, the scaler, this rank's generator and the position.
  safetensors::File rest = pack_training_state({}, {}, scheduler, position, scaler);
  for (const auto& [key, value] : rest.tensors) file.tensors.insert(key, value);
  for (const auto& [key, value] : rest.metadata) file.metadata.insert(key, value);
  file.metadata.insert(kLayout, parallel.layout_name());
  const std::string step_dir = dir + "/" + ckpt::step_dir_name(position.global_step);
  // The same step saved again (--checkpoint-every at an epoch's last step, then the
  // epoch's end): its old manifest goes first, so it never vouches for a mix of shards.
  if (dist.is_main()) ckpt::remove_manifest(step_dir);
  dist.barrier();
  ckpt::write_shard(step_dir, dist.rank(), dist.world_size(), file.tensors, file.metadata);
  dist.barrier();  // every shard is on disk: Note [The manifest is written last]
  if (dist.is_main()) {
    ckpt::write_manifest(step_dir, dist.world_size());
    ckpt::remove_other_checkpoints(dir, step_dir);
  }
}

TrainingPosition load_sharded_checkpoint(const std::string& step_dir, const Distributed& dist,
                                         const ParallelModel& parallel, const BuiltOptimizer& optimizer,
                                         optim::LRScheduler* scheduler, optim::GradScaler* scaler) {
  const ckpt::CheckpointIndex index = ckpt::read_checkpoint_index(step_dir);
  // The training state of this rank's own file when the world is the one that wrote it
  // (each rank's generator), else rank 0's (Note [Sharded checkpoints in train_cifar10]).
  const size_t own = index.files.size() == static_cast<size_t>(dist.world_size()) ? size_t(dist.rank()) : 0;
  const safetensors::File& file = index.files[own];
  LOOM_CHECK(file.metadata.contains(kLayout), step_dir, "/", index.file_names[own], " holds no '", kLayout,
             "' entry: it was written by an older format that resharding cannot read; resume it with the loom "
             "that wrote it, or start again");
  CheckpointState state = unpack_training_state(file, step_dir + "/" + index.file_names[own], scheduler, scaler);
  LocalState mine = parallel.local_state();
  ckpt::load(index, mine.model);
  if (optim::Optimizer* local = optimizer.local())
    ckpt::load_optimizer_state(*local, index, mine.params);
  const std::string& saved_layout = *file.metadata.find(kLayout);
  const std::string layout = parallel.layout_name();
  if (dist.is_main() && saved_layout != layout)
    std::fprintf(stderr, "resharded step %lld from %s (%zu files) into %s\n",
                 static_cast<long long>(state.position.global_step), saved_layout.c_str(), index.files.size(),
                 layout.c_str());
  return state.position;
}

TrainingPosition load_full_checkpoint_as_pieces(const std::string& path, const ParallelModel& parallel,
                                                const BuiltOptimizer& optimizer,
                                                const std::vector<std::string>& numbered_names,
                                                optim::LRScheduler* scheduler, optim::GradScaler* scaler) {
  const CheckpointState state = unpack_training_state(safetensors::read_file(path), path, scheduler, scaler);
  ckpt::ShardedState pieces;
  for (const auto& [name, t] : state.model) pieces.push_back(ckpt::whole(name, t));
  // Note [Flat optimizer state] (nn/optim/optimizer.h) to Note [Optimizer state by name].
  for (const auto& [key, t] : state.optimizer) {
    if (key.rfind("param_groups.", 0) == 0) {
      if (!key.ends_with(".params")) pieces.push_back(ckpt::whole("optim." + key, t));
      continue;
    }
    const size_t dot = key.find('.', 6);  // "state.<i>.<name>"
    LOOM_CHECK(key.rfind("state.", 0) == 0 && dot != std::string::npos, path, ": unexpected optimizer entry ", key);
    const size_t i = std::stoul(key.substr(6, dot - 6));
    LOOM_CHECK(i < numbered_names.size(), path, ": optimizer state ", key, " is for parameter ", i, ", but the model "
               "has ", numbered_names.size(), " parameters: it was saved from another model or optimizer");
    pieces.push_back(ckpt::whole(ckpt::optimizer_state_name(numbered_names[i], key.substr(dot + 1)), t));
  }
  const ckpt::CheckpointIndex index = ckpt::index_files({ckpt::pack(pieces)}, {"checkpoint.safetensors"}, path);
  LocalState mine = parallel.local_state();
  ckpt::load(index, mine.model);
  if (optim::Optimizer* local = optimizer.local()) ckpt::load_optimizer_state(*local, index, mine.params);
  return state.position;
}

}  // namespace loom::training
