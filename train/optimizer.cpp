#include "train/optimizer.h"

#include <map>
#include <set>

#include "core/error.h"                            // defines: LOOM_CHECK
#include "nn/optim/adamw.h"                        // defines: AdamW, param_groups_weight_decay
#include "nn/optim/sgd.h"                          // defines: SGD
#include "parallel/zero_redundancy_optimizer.h"    // defines: ZeroRedundancyOptimizer
#include "train/model_spec.h"                      // defines: model_spec (AdamW's exemptions)

namespace loom::training {

namespace {

// --optimizer adamw, and sgd with --no-decay-norms-and-biases: timm's two groups (no decay
// on biases, norms, embeddings and a ViT's tokens), decided on the model's own parameters
// and restricted to `params`, the tensors
// this rank steps. Those are the model's own parameters (one process, DDP, tp), or under
// per-parameter FSDP (fully_shard) each parameter's local shard, which `wrapped` names as
// the model names the parameter. FSDP's flat shards mix decayed and undecayed parameters
// in one buffer: no group can hold them.
std::vector<optim::ParamGroup> weight_decay_groups(const std::vector<Tensor>& params, const nn::Module& model,
                                                   const std::string& model_name, const nn::Module& wrapped,
                                                   double weight_decay, const std::string& who) {
  const ModelSpec& spec = model_spec(model_name);
  const std::set<std::string> exempt = spec.no_weight_decay ? spec.no_weight_decay(model) : std::set<std::string>{};
  std::vector<optim::ParamGroup> groups = optim::param_groups_weight_decay(model, weight_decay, exempt);
  // The group of every tensor that may be stepped: the model's parameters themselves, and
  // whatever the wrapper holds under a model parameter's name.
  std::map<const TensorImpl*, size_t> group_of;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Tensor& p : groups[g].params) group_of[p.unsafe_impl()] = g;
  std::map<std::string, size_t> group_by_name;
  for (const auto& [name, p] : model.named_parameters())
    if (auto it = group_of.find(p.unsafe_impl()); it != group_of.end()) group_by_name[name] = it->second;
  for (const auto& [name, p] : wrapped.named_parameters())
    if (auto it = group_by_name.find(name); it != group_by_name.end()) group_of.emplace(p.unsafe_impl(), it->second);
  for (optim::ParamGroup& group : groups) group.params.clear();
  size_t found = 0;
  for (const Tensor& p : params) {
    auto it = group_of.find(p.unsafe_impl());
    if (it == group_of.end()) continue;
    groups[it->second].params.push_back(p);
    ++found;
  }
  LOOM_CHECK(found == params.size() || weight_decay == 0.0, who, " exempts biases, norms and embeddings "
             "from weight decay parameter by parameter, and ", params.size() - found, " of the tensors this rank "
             "steps are not the model's own parameters (FSDP's flat shards, each mixing both kinds); use "
             "--fsdp-layout per_parameter (FSDP2: each parameter sharded on its own), --weight-decay 0, or DDP");
  if (found != params.size()) return {optim::ParamGroup{params, {}}};  // no decay anywhere: one group
  std::erase_if(groups, [](const optim::ParamGroup& g) { return g.params.empty(); });
  return groups;
}

}  // namespace

BuiltOptimizer build_optimizer(const std::vector<Tensor>& params, const nn::Module& model, const nn::Module& wrapped,
                               const distributed::DeviceMesh* mesh, const TrainConfig& config, double lr) {
  LOOM_CHECK(config.optim.name == "sgd" || config.optim.name == "adamw",
             "build_optimizer: optim.name is sgd or adamw, got '", config.optim.name, "'");
  const optim::SGDOptions sgd{.lr = lr,
                              .momentum = config.optim.momentum,
                              .weight_decay = config.optim.weight_decay,
                              .nesterov = config.optim.nesterov};
  const optim::AdamWOptions adamw{.lr = lr, .weight_decay = config.optim.weight_decay};
  if (!config.parallel.zero_redundancy_optimizer) {
    if (config.optim.name == "adamw")
      return {std::make_unique<optim::AdamW>(
          weight_decay_groups(params, model, config.model.name, wrapped, adamw.weight_decay, "--optimizer adamw"),
          adamw)};
    if (config.optim.no_decay_norms_and_biases)
      return {std::make_unique<optim::SGD>(weight_decay_groups(params, model, config.model.name, wrapped,
                                                               sgd.weight_decay, "--no-decay-norms-and-biases"),
                                           sgd)};
    return {std::make_unique<optim::SGD>(params, sgd)};
  }
  LOOM_CHECK(mesh != nullptr && mesh->has("dp_replicate"), "--zero-redundancy-optimizer shards the optimizer state "
             "over DDP's replicas: it needs --dp-replicate (or --mode ddp) under loomrun");
  LOOM_CHECK(config.optim.name == "sgd" || config.optim.weight_decay == 0.0,
             "--zero-redundancy-optimizer with --optimizer "
             "adamw partitions the parameters without timm's weight-decay groups; use --weight-decay 0, or no ZeRO-1");
  LOOM_CHECK(!config.optim.no_decay_norms_and_biases || config.optim.weight_decay == 0.0,
             "--zero-redundancy-optimizer with --no-decay-norms-and-biases: ZeRO-1 partitions the parameters "
             "without weight-decay groups; drop one of them, or use --weight-decay 0");
  // The group DDP averages the gradients over: its ranks hold the same parameters.
  auto zero = config.optim.name == "adamw"
                  ? std::make_unique<parallel::ZeroRedundancyOptimizer>(
                        params, parallel::optimizer_class<optim::AdamW>(adamw), mesh->group("dp_replicate"))
                  : std::make_unique<parallel::ZeroRedundancyOptimizer>(
                        params, parallel::optimizer_class<optim::SGD>(sgd), mesh->group("dp_replicate"));
  BuiltOptimizer built;
  built.zero_redundancy = zero.get();
  built.optimizer = std::move(zero);
  return built;
}

optim::Optimizer* BuiltOptimizer::local() const {
  return zero_redundancy ? zero_redundancy->local_optimizer() : optimizer.get();
}

void BuiltOptimizer::gather_state() const {
  if (zero_redundancy) zero_redundancy->consolidate_state_dict(0);
}

}  // namespace loom::training
