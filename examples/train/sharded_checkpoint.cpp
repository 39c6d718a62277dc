#include "examples/train/sharded_checkpoint.h"

#include "core/error.h"
#include "examples/train/optimizer.h"             // defines: zero_redundancy_of (ZeRO-1's partition)
#include "parallel/distributed_checkpoint.h"      // defines: write_shard, write_manifest, read_shard
#include "parallel/fsdp/sharded_state_dict.h"     // defines: sharded_state_dict, check_sharded_compatible
#include "parallel/tensor/tp_state_dict.h"        // defines: describe_placements (--tp)
#include "parallel/zero_redundancy_optimizer.h"   // defines: ZeroRedundancyOptimizer::sharded_state_dict

namespace loom::examples {
namespace ckpt = distributed::checkpoint;

// The metadata key of a sharded checkpoint's tensor-parallel placements (describe_placements).
constexpr const char* kTensorParallelPlacements = "tensor_parallel_placements";

void save_sharded_checkpoint(const std::string& dir, const Distributed& dist, const ParallelModel& parallel,
                             const optim::Optimizer& optimizer, const optim::LRScheduler* scheduler,
                             const TrainingPosition& position, const optim::GradScaler* scaler) {
  // This rank's state: FSDP's shards or the model (ZeRO-1: replicated; --pp: this stage's
  // chunks are the ones it trains), and its optimizer's (ZeRO-1: its partition).
  OrderedDict<Tensor> model_state;
  safetensors::Metadata layout;
  if (parallel.sharded_parts.empty()) model_state = parallel.model->state_dict();
  for (const ParallelModel::ShardedPart& part : parallel.sharded_parts) {
    add_prefixed(model_state, part.prefix, fsdp::sharded_state_dict(*part.fsdp));
    add_prefixed(layout, part.prefix, fsdp::sharding_metadata(*part.fsdp));
  }
  const parallel::ZeroRedundancyOptimizer* zero = zero_redundancy_of(optimizer);
  safetensors::File file = pack_training_state(model_state, zero ? zero->sharded_state_dict() : optimizer.state_dict(),
                                               scheduler, position, scaler);
  for (const auto& [key, value] : layout) file.metadata.insert(key, value);
  // --tp: each split tensor's placement, so that a resume can tell a checkpoint cut another way.
  if (!parallel.tp_placements.empty())
    file.metadata.insert(kTensorParallelPlacements, distributed::describe_placements(parallel.tp_placements));
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
                                         const ParallelModel& parallel, optim::Optimizer& optimizer,
                                         optim::LRScheduler* scheduler, optim::GradScaler* scaler) {
  const std::string source = step_dir + "/" + ckpt::shard_file_name(dist.rank(), dist.world_size());
  // read_shard refuses another world size first; fsdp's check names the rest of the cut.
  CheckpointState state =
      unpack_training_state(ckpt::read_shard(step_dir, dist.rank(), dist.world_size()), source, scheduler, scaler);
  const std::string* saved_placements = state.metadata.find(kTensorParallelPlacements);
  const std::string placements = distributed::describe_placements(parallel.tp_placements);
  LOOM_CHECK((saved_placements ? *saved_placements : std::string()) == placements, source, " was saved with ",
             saved_placements ? "tensors split over tensor-parallel ranks as\n" + *saved_placements
                              : std::string("no tensor parallelism"),
             "\nbut this run ", placements.empty() ? "has no tensor parallelism" : "splits them as\n" + placements,
             "; resume with the --tp (and degrees) the checkpoint was saved with");
  if (parallel.sharded_parts.empty()) parallel.model->load_state_dict(state.model, /*strict=*/true);
  for (const ParallelModel::ShardedPart& part : parallel.sharded_parts) {
    fsdp::check_sharded_compatible(*part.fsdp, take_prefixed(state.metadata, part.prefix), source);
    fsdp::load_sharded_state_dict(*part.fsdp, take_prefixed(state.model, part.prefix));
  }
  if (auto* zero = zero_redundancy_of(optimizer)) zero->load_sharded_state_dict(state.optimizer);
  else optimizer.load_state_dict(state.optimizer);
  return state.position;
}

int clear_sharded_checkpoints(const std::string& dir) { return ckpt::remove_all_checkpoints(dir); }

}  // namespace loom::examples
