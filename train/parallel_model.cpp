#include "train/parallel_model.h"

#include <map>
#include <optional>
#include <set>

#include "core/error.h"                         // defines: LOOM_CHECK
#include "nn/models.h"                          // defines: sequential_view (the whole model's layers)
#include "parallel/checkpoint/optimizer_state.h"  // defines: ParamPieces
#include "parallel/fsdp/runtime.h"              // defines: ShardingStrategy
#include "parallel/fsdp/state_dict.h"           // defines: full_state_dict, full_optim_state_dict
#include "parallel/tensor/tp_state_dict.h"      // defines: gather_tp_state (--tp)

namespace loom::training {
namespace ckpt = distributed::checkpoint;

ParallelModel::ParallelModel(std::shared_ptr<nn::Module> model, const distributed::ParallelDims& dims,
                             const distributed::DeviceMesh* mesh)
    : model_(model), module_(model), parts_{{model, nullptr}}, dims_(dims), mesh_(mesh), whole_(model) {}

void ParallelModel::set_whole_part(ModelPart part) {
  module_ = part.module;
  parts_ = {std::move(part)};
}

void ParallelModel::set_stage(std::shared_ptr<parallel::pipeline::PipelineStage> stage,
                              parallel::pipeline::StageShards shards, std::shared_ptr<nn::Module> whole_copy) {
  parts_.clear();
  const auto virtual_stages = stage->local_virtual_stages();
  for (size_t v = 0; v < virtual_stages.size(); ++v) {
    std::shared_ptr<fsdp::FullyShardedDataParallel> fsdp = v < shards.size() ? shards[v] : nullptr;
    parts_.push_back({fsdp ? std::shared_ptr<nn::Module>(fsdp) : std::shared_ptr<nn::Module>(virtual_stages[v]), fsdp});
  }
  module_ = stage;
  pipeline_ = stage;
  stage_ = std::move(stage);
  stage_shards_ = std::move(shards);
  if (whole_copy) whole_ = std::move(whole_copy);
}

fsdp::FullyShardedDataParallel* ParallelModel::whole_model_fsdp() const {
  return !stage_ && parts_.size() == 1 ? parts_[0].fsdp.get() : nullptr;
}

void ParallelModel::gather_whole() {
  if (!stage_) return;
  // Under FSDP the stage's own layers hold shards, so share_weights cannot read them: the
  // virtual stages are gathered within their FSDP groups into the copy first.
  if (stage_shards_.empty()) stage_->share_weights();
  else parallel::pipeline::gather_stage_weights(*stage_, stage_shards_, *nn::sequential_view(*whole_));
}

nn::Module& ParallelModel::for_evaluation() {
  if (!stage_) return *module_;
  gather_whole();  // --pp: every rank evaluates the whole model
  return *whole_;
}

OrderedDict<Tensor> ParallelModel::full_state_dict() {
  gather_whole();
  // FSDP: every rank gathers, rank 0 of each shard group gets the tensors. --tp: those (or
  // the model's own) are each rank's tp shards, gathered whole over the tp ranks.
  fsdp::FullyShardedDataParallel* fsdp = whole_model_fsdp();
  OrderedDict<Tensor> state = fsdp ? fsdp::full_state_dict(*fsdp) : whole_->state_dict();
  if (!state.empty() && !tp_placements_.empty()) state = distributed::gather_tp_state(state, tp_placements_);
  return state;
}

void ParallelModel::load_full_state_dict(const OrderedDict<Tensor>& state) {
  LOOM_CHECK(!stage_ && tp_placements_.empty(), "ParallelModel::load_full_state_dict: a whole state loads into a "
             "model that is not cut into pipeline stages or tensor-parallel shards; ", dims_.str(),
             " loads its sharded state (local_state)");
  if (fsdp::FullyShardedDataParallel* fsdp = whole_model_fsdp()) fsdp::load_full_state_dict(*fsdp, state);
  else model_->load_state_dict(state, /*strict=*/true);
}

OrderedDict<Tensor> ParallelModel::full_optim_state_dict(const BuiltOptimizer& optimizer, bool main) {
  if (fsdp::FullyShardedDataParallel* fsdp = whole_model_fsdp()) return fsdp::full_optim_state_dict(*fsdp, *optimizer);
  optimizer.gather_state();  // ZeRO-1: the whole state to rank 0 (a collective)
  return main ? (*optimizer).state_dict() : OrderedDict<Tensor>{};
}

void ParallelModel::load_full_optim_state_dict(const BuiltOptimizer& optimizer, const OrderedDict<Tensor>& state) {
  if (fsdp::FullyShardedDataParallel* fsdp = whole_model_fsdp()) fsdp::load_full_optim_state_dict(*fsdp, *optimizer, state);
  else (*optimizer).load_state_dict(state);
}

std::string ParallelModel::layout_name() const {
  std::string name = dims_.str();
  for (const ModelPart& part : parts_)
    if (part.fsdp)
      return name + (part.fsdp->per_parameter_sharding() ? ", FSDP2 per-parameter shards" : ", FSDP1 flat shards");
  return name;
}

// See Note [Sharded checkpoints in train_cifar10] (sharded_checkpoint.h).
ModelParametersOf ParallelModel::model_parameters_of() const {
  // A parameter stepped whole (one process, DDP, a stage, a tp part) is the model's own
  // object. A wrapper's shard is found through local_state(), built once when first needed,
  // with the whole parameters' shapes (FSDP leaves the model's objects empty); what holds
  // no piece (a tp rank's empty share of a small tensor) by the name the wrapper gives it.
  auto own = std::make_shared<std::map<const TensorImpl*, WholeParameter>>();
  for (const auto& [name, p] : model_->named_parameters()) own->emplace(p.unsafe_impl(), WholeParameter{name, p.dim()});
  auto wrapped = std::make_shared<std::map<const TensorImpl*, WholeParameter>>();
  for (const auto& [name, p] : module_->named_parameters())
    wrapped->emplace(p.unsafe_impl(), WholeParameter{name, p.dim()});
  auto pieces = std::make_shared<std::optional<distributed::checkpoint::ParamPieces>>();
  return [this, own, wrapped, pieces](const Tensor& t) {
    if (auto found = own->find(t.unsafe_impl()); found != own->end()) return std::vector<WholeParameter>{found->second};
    if (!*pieces) *pieces = local_state().params;
    std::vector<WholeParameter> wholes;
    if (auto it = (*pieces)->find(t.unsafe_impl()); it != (*pieces)->end())
      for (const auto& piece : it->second.pieces)
        wholes.push_back({piece.name, static_cast<int64_t>(piece.global_shape.size())});
    if (wholes.empty())
      if (auto found = wrapped->find(t.unsafe_impl()); found != wrapped->end()) wholes.push_back(found->second);
    return wholes;
  };
}

LocalState ParallelModel::local_state() const {
  const distributed::ParallelDims::Coordinates at = dims_.coordinates(mesh_ ? mesh_->rank() : 0);
  // The plain model's names for its tensors (FSDP's units and a pipeline's stages hold the
  // model's own parameter and buffer objects, so identity finds them).
  std::map<const TensorImpl*, std::string> names;
  for (const auto& [name, t] : model_->named_parameters()) names.emplace(t.unsafe_impl(), name);
  for (const auto& [name, t] : model_->named_buffers()) names.emplace(t.unsafe_impl(), name);
  auto name_of = [&](const Tensor& t) {
    auto found = names.find(t.unsafe_impl());
    LOOM_CHECK(found != names.end(), "sharded checkpoint: a tensor of shape ", t.shape(),
               " that this rank holds is not one of the model's");
    return found->second;
  };
  // --tp: a split tensor's local part is a box of the whole one.
  ckpt::GlobalOf global_of = [&](const std::string& name, const Shape& local_shape) -> std::pair<Shape, ckpt::Chunk> {
    const distributed::DTensorSpec* spec = tp_placements_.find(name);
    if (!spec) return ckpt::untranslated(name, local_shape);
    return {spec->shape, ckpt::cut(ckpt::whole_chunk(spec->shape), spec->placement, dims_.tp, at.tp)};
  };
  LocalState out;
  // FSDP's shards: saved by the first replica of HSDP.
  for (const ModelPart& part : parts_)
    if (part.fsdp)
      for (auto& [impl, local] : ckpt::fsdp_param_pieces(*part.fsdp, name_of, global_of, at.dp_replicate == 0)) {
        out.model.push_back(local);
        out.params.emplace(impl, local);
      }
  // The model's own tensors that this rank trains or keeps: all of them in one process and
  // under DDP, a stage's under --pp, the buffers under FSDP. Each is whole, or its tp part;
  // written by one of the ranks that hold it alike.
  std::set<const TensorImpl*> held;
  for (const ModelPart& part : parts_) {
    for (const Tensor& t : part.module->parameters()) held.insert(t.unsafe_impl());
    for (const auto& [name, t] : part.module->named_buffers()) held.insert(t.unsafe_impl());
    if (part.fsdp)
      for (const auto& [name, t] : part.fsdp->module()->named_buffers()) held.insert(t.unsafe_impl());
  }
  auto add = [&](const std::string& name, const Tensor& t, bool parameter) {
    if (!held.count(t.unsafe_impl()) || out.params.count(t.unsafe_impl())) return;
    const distributed::DTensorSpec* spec = tp_placements_.find(name);
    const bool first = at.dp_replicate == 0 && at.dp_shard == 0 && (spec || at.tp == 0);
    // (A loom::Error if t is not contiguous: loading must land in t itself.)
    ckpt::LocalTensor local =
        spec ? ckpt::sharded(name, t, spec->shape, spec->placement, dims_.tp, at.tp) : ckpt::whole(name, t);
    local.write = first;
    out.model.push_back(local);
    if (parameter) out.params.emplace(t.unsafe_impl(), local);
  };
  for (const auto& [name, t] : model_->named_parameters()) add(name, t, true);
  for (const auto& [name, t] : model_->named_buffers()) add(name, t, false);
  return out;
}

GradNormTerms ParallelModel::grad_norm_terms(const std::vector<Tensor>& stepped) const {
  bool per_parameter = true, any_fsdp = false, sharded = false;
  for (const ModelPart& part : parts_)
    if (part.fsdp) {
      any_fsdp = true;
      per_parameter = per_parameter && part.fsdp->per_parameter_sharding();
      sharded = sharded || part.fsdp->sharding_strategy() != fsdp::ShardingStrategy::NO_SHARD;
    }
  per_parameter = per_parameter && any_fsdp;
  LOOM_CHECK(!(dims_.tp_enabled() && dims_.dp_shard_enabled()) || (per_parameter && !stage_),
             "--clip-grad-norm with --tp ", dims_.tp, " and --dp-shard ", dims_.dp_shard, stage_ ? " and --pp" : "",
             ": FSDP's flat shards mix tensor-parallel shards with tensors every tp rank holds whole, so their norm "
             "cannot be summed over the ranks (Note [Whose gradients a rank adds to the norm]); use --fsdp-layout "
             "per_parameter (without --pp), clip under --tp with --dp-replicate, or under --dp-shard without --tp");
  // See Note [Whose gradients a rank adds to the norm].
  std::set<const TensorImpl*> split;
  for (const auto& [name, p] : model_->named_parameters())
    if (tp_placements_.contains(name)) split.insert(p.unsafe_impl());
  // FSDP2's local rows are tensors of their own, under the model's names (one part: no --pp).
  if (per_parameter && !stage_)
    for (const auto& [name, p] : parts_.front().fsdp->named_parameters())
      if (tp_placements_.contains(name)) split.insert(p.unsafe_impl());
  GradNormTerms out;
  const bool tp_rank0 = !dims_.tp_enabled() || mesh_->group("tp")->rank() == 0;
  for (const Tensor& p : stepped)
    if (tp_rank0 || split.count(p.unsafe_impl())) out.counted.push_back(p);
  if (mesh_ == nullptr) return out;
  for (const char* dim : {"pp", "dp_shard", "tp"})
    if (mesh_->has(dim) && (std::string(dim) != "dp_shard" || (dims_.dp_shard_enabled() && sharded)))
      out.sum_over.push_back(mesh_->group(dim));
  return out;
}

}  // namespace loom::training
