#include "examples/train/optimizer.h"

#include <set>

#include "core/error.h"                            // defines: LOOM_CHECK
#include "nn/optim/adamw.h"                        // defines: AdamW, param_groups_weight_decay
#include "nn/optim/sgd.h"                          // defines: SGD
#include "nn/vision_transformer.h"                 // defines: VisionTransformer::no_weight_decay
#include "parallel/zero_redundancy_optimizer.h"    // defines: ZeroRedundancyOptimizer

namespace loom::examples {

namespace {

// --optimizer adamw: timm's two groups (no decay on biases, norms, embeddings and a ViT's
// tokens) restricted to `params`, the tensors this rank steps. They must be the model's own
// parameters: FSDP's flat shards mix decayed and undecayed ones in one buffer.
std::vector<optim::ParamGroup> adamw_groups(const std::vector<Tensor>& params, const nn::Module& model,
                                            double weight_decay) {
  std::set<std::string> exempt;
  if (auto* vit = dynamic_cast<const nn::VisionTransformer*>(&model)) exempt = vit->no_weight_decay();
  std::vector<optim::ParamGroup> groups = optim::param_groups_weight_decay(model, weight_decay, exempt);
  std::set<const TensorImpl*> stepped;
  for (const Tensor& p : params) stepped.insert(p.unsafe_impl());
  size_t found = 0;
  for (optim::ParamGroup& group : groups) {
    std::vector<Tensor> mine;
    for (const Tensor& p : group.params)
      if (stepped.count(p.unsafe_impl())) mine.push_back(p);
    group.params = std::move(mine);
    found += group.params.size();
  }
  LOOM_CHECK(found == params.size() || weight_decay == 0.0, "--optimizer adamw exempts biases, norms and embeddings "
             "from weight decay parameter by parameter, and ", params.size() - found, " of the tensors this rank "
             "steps are not the model's own parameters (FSDP's flat shards, each mixing both kinds); use "
             "--weight-decay 0 with --dp-shard, or DDP");
  if (found != params.size()) return {optim::ParamGroup{params, {}}};  // no decay anywhere: one group
  std::erase_if(groups, [](const optim::ParamGroup& g) { return g.params.empty(); });
  return groups;
}

}  // namespace

std::unique_ptr<optim::Optimizer> build_optimizer(const std::vector<Tensor>& params, const nn::Module& model,
                                                  const distributed::DeviceMesh* mesh, const TrainConfig& config,
                                                  double lr) {
  LOOM_CHECK(config.optimizer == "sgd" || config.optimizer == "adamw", "--optimizer: expected sgd or adamw, got '",
             config.optimizer, "'");
  const optim::SGDOptions sgd{.lr = lr, .momentum = config.momentum, .weight_decay = config.weight_decay,
                              .nesterov = config.nesterov};
  const optim::AdamWOptions adamw{.lr = lr, .weight_decay = config.weight_decay};
  if (!config.zero_redundancy_optimizer) {
    if (config.optimizer == "adamw") return std::make_unique<optim::AdamW>(adamw_groups(params, model, adamw.weight_decay), adamw);
    return std::make_unique<optim::SGD>(params, sgd);
  }
  LOOM_CHECK(mesh != nullptr && mesh->has("dp_replicate"), "--zero-redundancy-optimizer shards the optimizer state "
             "over DDP's replicas: it needs --dp-replicate (or --mode ddp) under loomrun");
  LOOM_CHECK(config.optimizer == "sgd" || config.weight_decay == 0.0, "--zero-redundancy-optimizer with --optimizer "
             "adamw partitions the parameters without timm's weight-decay groups; use --weight-decay 0, or no ZeRO-1");
  // The group DDP averages the gradients over: its ranks hold the same parameters.
  if (config.optimizer == "adamw")
    return std::make_unique<parallel::ZeroRedundancyOptimizer>(
        params, parallel::optimizer_class<optim::AdamW>(adamw), mesh->group("dp_replicate"));
  return std::make_unique<parallel::ZeroRedundancyOptimizer>(
      params, parallel::optimizer_class<optim::SGD>(sgd), mesh->group("dp_replicate"));
}

parallel::ZeroRedundancyOptimizer* zero_redundancy_of(const optim::Optimizer& optimizer) {
  return dynamic_cast<parallel::ZeroRedundancyOptimizer*>(const_cast<optim::Optimizer*>(&optimizer));
}

void gather_optimizer_state(optim::Optimizer& optimizer) {
  if (auto* zero = zero_redundancy_of(optimizer)) zero->consolidate_state_dict(0);
}

}  // namespace loom::examples
