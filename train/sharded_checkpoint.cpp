#include "train/sharded_checkpoint.h"

#include <cstdio>
#include <set>

#include "core/error.h"
#include "train/optimizer.h"              // defines: BuiltOptimizer (ZeRO-1's partition)
#include "parallel/checkpoint/fsdp_state.h"        // defines: fsdp_param_pieces
#include "parallel/checkpoint/load_plan.h"         // defines: read_checkpoint_index, load
#include "parallel/checkpoint/optimizer_state.h"   // defines: optimizer_pieces, load_optimizer_state
#include "parallel/distributed_checkpoint.h"       // defines: write_shard, write_manifest
#include "parallel/zero_redundancy_optimizer.h"    // defines: ZeroRedundancyOptimizer::local_optimizer

namespace loom::training {
namespace ckpt = distributed::checkpoint;

namespace {

// The metadata key of the layout that wrote a sharded checkpoint, for the resume's message.
constexpr const char* kLayout = "layout";

// "pp=1 dp_replicate=1 dp_shard=2 tp=1 (world 2), FSDP2 per-parameter shards": the degrees,
// and which FSDP layout cut the model (the same degrees hold other shards under each).
std::string layout_name(const Distributed& dist, const ParallelModel& parallel) {
  std::string name = dist.dims().str();
  if (!parallel.sharded_parts.empty())
    name += parallel.sharded_parts.front().fsdp->per_parameter_sharding() ? ", FSDP2 per-parameter shards"
                                                                           : ", FSDP1 flat shards";
  return name;
}

// This rank's part of the model's state as pieces of the plain model's tensors (Note
// [Every layout is a set of boxes]), and, among them, each tensor the optimizer steps.
struct RankState {
  ckpt::ShardedState model;
  ckpt::ParamPieces params;
};

// See Note [Sharded checkpoints in train_cifar10].
RankState describe_rank_state(const Distributed& dist, const ParallelModel& parallel) {
  const distributed::ParallelDims& dims = dist.dims();
  const distributed::ParallelDims::Coordinates at = dims.coordinates(dist.rank());
  // The plain model's names for its tensors (FSDP's units and a pipeline's stages hold the
  // model's own parameter and buffer objects, so identity finds them).
  std::map<const TensorImpl*, std::string> names;
  for (const auto& [name, t] : parallel.model->named_parameters()) names.emplace(t.unsafe_impl(), name);
  for (const auto& [name, t] : parallel.model->named_buffers()) names.emplace(t.unsafe_impl(), name);
  auto name_of = [&](const Tensor& t) {
    auto found = names.find(t.unsafe_impl());
    LOOM_CHECK(found != names.end(), "sharded checkpoint: a tensor of shape ", t.shape(),
               " that this rank holds is not one of the model's");
    return found->second;
  };
  // --tp: a split tensor's local part is a box of the whole one.
  ckpt::GlobalOf global_of = [&](const std::string& name, const Shape& local_shape) -> std::pair<Shape, ckpt::Chunk> {
    const distributed::DTensorSpec* spec = parallel.tp_placements.find(name);
    if (!spec) return ckpt::untranslated(name, local_shape);
    return {spec->shape, ckpt::cut(ckpt::whole_chunk(spec->shape), spec->placement, dims.tp, at.tp)};
  };
  RankState out;
  // FSDP's shards: saved by the first replica of HSDP.
  for (const ParallelModel::ShardedPart& part : parallel.sharded_parts)
    for (auto& [impl, local] : ckpt::fsdp_param_pieces(*part.fsdp, name_of, global_of, at.dp_replicate == 0)) {
      out.model.push_back(local);
      out.params.emplace(impl, local);
    }
  // The model's own tensors that this rank trains or keeps: all of them in one process and
  // under DDP, a stage's under --pp, the buffers under FSDP. Each is whole, or its tp part;
  // written by one of the ranks that hold it alike.
  std::set<const TensorImpl*> held;
  for (const Tensor& t : parallel.module->parameters()) held.insert(t.unsafe_impl());
  for (const auto& [name, t] : parallel.module->named_buffers()) held.insert(t.unsafe_impl());
  for (const ParallelModel::ShardedPart& part : parallel.sharded_parts)
    for (const auto& [name, t] : part.fsdp->module()->named_buffers()) held.insert(t.unsafe_impl());
  auto add = [&](const std::string& name, const Tensor& t, bool parameter) {
    if (!held.count(t.unsafe_impl()) || out.params.count(t.unsafe_impl())) return;
    const distributed::DTensorSpec* spec = parallel.tp_placements.find(name);
    const bool first = at.dp_replicate == 0 && at.dp_shard == 0 && (spec || at.tp == 0);
    // (A loom::Error if t is not contiguous: loading must land in t itself.)
    ckpt::LocalTensor local =
        spec ? ckpt::sharded(name, t, spec->shape, spec->placement, dims.tp, at.tp) : ckpt::whole(name, t);
    local.write = first;
    out.model.push_back(local);
    if (parameter) out.params.emplace(t.unsafe_impl(), local);
  };
  for (const auto& [name, t] : parallel.model->named_parameters()) add(name, t, true);
  for (const auto& [name, t] : parallel.model->named_buffers()) add(name, t, false);
  return out;
}

}  // namespace

void save_sharded_checkpoint(const std::string& dir, const Distributed& dist, const ParallelModel& parallel,
                             const BuiltOptimizer& optimizer, const optim::LRScheduler* scheduler,
                             const TrainingPosition& position, const optim::GradScaler* scaler) {
  RankState mine = describe_rank_state(dist, parallel);
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
  file.metadata.insert(kLayout, layout_name(dist, parallel));
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
  RankState mine = describe_rank_state(dist, parallel);
  ckpt::load(index, mine.model);
  if (optim::Optimizer* local = optimizer.local())
    ckpt::load_optimizer_state(*local, index, mine.params);
  const std::string& saved_layout = *file.metadata.find(kLayout);
  const std::string layout = layout_name(dist, parallel);
  if (dist.is_main() && saved_layout != layout)
    std::fprintf(stderr, "resharded step %lld from %s (%zu files) into %s\n",
                 static_cast<long long>(state.position.global_step), saved_layout.c_str(), index.files.size(),
                 layout.c_str());
  return state.position;
}

int clear_sharded_checkpoints(const std::string& dir) { return ckpt::remove_all_checkpoints(dir); }

}  // namespace loom::training
