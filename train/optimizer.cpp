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
// on biases, norms, embeddings and a ViT's tokens), decided for each whole parameter of the
// model by its name and dimensions and applied to `params`, the tensors this rank steps,
// through the parameters each holds pieces of (ModelParametersOf). The groups are as
// optim::param_groups_weight_decay makes them, [no decay, decay], each in `params`' order.
// A tensor whose pieces fall in both (FSDP1's flat shard of a unit with weights and biases)
// can go in neither.
std::vector<optim::ParamGroup> weight_decay_groups(const std::vector<Tensor>& params, const nn::Module& model,
                                                   const std::string& model_name,
                                                   const ModelParametersOf& parameters_of, double weight_decay,
                                                   const std::string& who) {
  const ModelSpec& spec = model_spec(model_name);
  const auto exempt = optim::exempt_from_weight_decay(
      model, spec.no_weight_decay ? spec.no_weight_decay(model) : std::set<std::string>{});
  optim::ParamGroup no_decay{{}, {{"weight_decay", 0.0}}}, decay{{}, {{"weight_decay", weight_decay}}};
  int64_t mixed = 0;
  for (const Tensor& p : params) {
    std::set<bool> kinds;
    for (const WholeParameter& whole : parameters_of(p)) kinds.insert(exempt(whole.name, whole.dim));
    if (kinds.size() != 1) ++mixed;
    (kinds.count(false) ? decay : no_decay).params.push_back(p);
  }
  LOOM_CHECK(mixed == 0 || weight_decay == 0.0, who, " exempts biases, norms and embeddings from weight decay "
             "parameter by parameter, and ", mixed, " of the tensors this rank steps hold pieces of both kinds "
             "(FSDP's flat shards) or of no parameter; use --fsdp-layout per_parameter (FSDP2: each parameter "
             "sharded on its own), --weight-decay 0, or DDP");
  if (mixed != 0) return {optim::ParamGroup{params, {}}};  // no decay anywhere: one group
  std::vector<optim::ParamGroup> groups;
  for (optim::ParamGroup* g : {&no_decay, &decay})
    if (!g->params.empty()) groups.push_back(std::move(*g));
  return groups;
}

}  // namespace

ModelParametersOf own_parameters(const nn::Module& model) {
  auto wholes = std::make_shared<std::map<const TensorImpl*, WholeParameter>>();
  for (const auto& [name, p] : model.named_parameters())
    wholes->emplace(p.unsafe_impl(), WholeParameter{name, p.dim()});
  return [wholes](const Tensor& t) {
    auto it = wholes->find(t.unsafe_impl());
    return it == wholes->end() ? std::vector<WholeParameter>{} : std::vector<WholeParameter>{it->second};
  };
}

BuiltOptimizer build_optimizer(const std::vector<Tensor>& params, const nn::Module& model,
                               const ModelParametersOf& parameters_of, const distributed::DeviceMesh* mesh,
                               const TrainConfig& config, double lr) {
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
          weight_decay_groups(params, model, config.model.name, parameters_of, adamw.weight_decay, "--optimizer adamw"),
          adamw)};
    if (config.optim.no_decay_norms_and_biases)
      return {std::make_unique<optim::SGD>(weight_decay_groups(params, model, config.model.name, parameters_of,
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
