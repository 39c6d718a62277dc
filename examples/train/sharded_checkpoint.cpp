#include "examples/train/sharded_checkpoint.h"

#include "core/error.h"
#include "parallel/distributed_checkpoint.h"      // defines: write_shard, write_manifest, read_shard
#include "parallel/fsdp/sharded_state_dict.h"     // defines: sharded_state_dict, check_sharded_compatible
#include "parallel/zero_redundancy_optimizer.h"   // defines: ZeroRedundancyOptimizer::sharded_state_dict

namespace loom::examples {
namespace ckpt = distributed::checkpoint;
namespace {

parallel::ZeroRedundancyOptimizer* zero_of(const optim::Optimizer& optimizer) {
  return dynamic_cast<parallel::ZeroRedundancyOptimizer*>(const_cast<optim::Optimizer*>(&optimizer));
}

// Neither FSDP nor ZeRO: nothing is sharded, and a shard would be a full copy per rank.
void check_sharded(const fsdp::FullyShardedDataParallel* fsdp, const optim::Optimizer& optimizer) {
  LOOM_CHECK(fsdp || zero_of(optimizer), "--checkpoint-format sharded: nothing is sharded in this run (it needs "
             "--mode fsdp or --zero-redundancy-optimizer); use --checkpoint-format full");
}

}  // namespace

bool sharded_checkpoint_format(const TrainConfig& config) {
  const bool sharded_state = config.mode == "fsdp" || config.zero_redundancy_optimizer;
  if (config.checkpoint_format.empty()) return sharded_state;
  LOOM_CHECK(config.checkpoint_format == "full" || config.checkpoint_format == "sharded",
             "--checkpoint-format: expected full (FULL_STATE_DICT: one file gathered on rank 0) or sharded "
             "(SHARDED_STATE_DICT: a file per rank and a manifest), got '", config.checkpoint_format, "'");
  LOOM_CHECK(config.checkpoint_format == "full" || sharded_state, "--checkpoint-format sharded: nothing is sharded "
             "under --mode ", config.mode, " (it needs --mode fsdp or --zero-redundancy-optimizer); use full");
  return config.checkpoint_format == "sharded";
}

void save_sharded_checkpoint(const std::string& dir, const Distributed& dist, fsdp::FullyShardedDataParallel* fsdp,
                             const nn::Module& model, const optim::Optimizer& optimizer,
                             const optim::LRScheduler* scheduler, const TrainingPosition& position,
                             const optim::GradScaler* scaler) {
  check_sharded(fsdp, optimizer);
  safetensors::File file =
      fsdp ? pack_training_state(fsdp::sharded_state_dict(*fsdp), optimizer.state_dict(), scheduler, position, scaler)
           : pack_training_state(model.state_dict(), zero_of(optimizer)->sharded_state_dict(), scheduler, position,
                                 scaler);
  if (fsdp)
    for (const auto& [key, value] : fsdp::sharding_metadata(*fsdp)) file.metadata.insert(key, value);
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
                                         fsdp::FullyShardedDataParallel* fsdp, nn::Module& model,
                                         optim::Optimizer& optimizer, optim::LRScheduler* scheduler,
                                         optim::GradScaler* scaler) {
  check_sharded(fsdp, optimizer);
  const std::string source = step_dir + "/" + ckpt::shard_file_name(dist.rank(), dist.world_size());
  // read_shard refuses another world size first; fsdp's check names the rest of the cut.
  CheckpointState state =
      unpack_training_state(ckpt::read_shard(step_dir, dist.rank(), dist.world_size()), source, scheduler, scaler);
  if (fsdp) {
    fsdp::check_sharded_compatible(*fsdp, state.metadata, source);
    fsdp::load_sharded_state_dict(*fsdp, state.model);
    optimizer.load_state_dict(state.optimizer);
  } else {
    model.load_state_dict(state.model, /*strict=*/true);
    zero_of(optimizer)->load_sharded_state_dict(state.optimizer);
  }
  return state.position;
}

int clear_sharded_checkpoints(const std::string& dir) { return ckpt::remove_all_checkpoints(dir); }

}  // namespace loom::examples
