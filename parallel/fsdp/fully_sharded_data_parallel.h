// FullyShardedDataParallel: data parallelism where every rank keeps only 1/N of the
// parameters, gradients and optimizer state (ZeRO-3; ZeRO-2 with SHARD_GRAD_OP), as
// torch.distributed.fsdp.FullyShardedDataParallel. docs/fsdp.md has the picture.
//
//   // launched as: loomrun --nproc_per_node 2 ./train
//   distributed::init_process_group("gloo");
//   auto model = nn::resnet18();
//   fsdp::FullyShardedDataParallel fsdp(model, distributed::default_group(),
//                                       {.sharding_strategy = fsdp::ShardingStrategy::FULL_SHARD});
//   optim::SGD opt(fsdp.parameters(), {.lr = 0.1});   // the shards: 1/N of the model
//   for (auto& batch : loader) {                       // a DistributedSampler shards the data
//     Tensor loss = cross_entropy(fsdp(batch.data), batch.target);
//     opt.zero_grad();
//     loss.backward();                                 // returns with the shards' averaged gradients
//     opt.step();                                      // steps this rank's shards only
//   }
//   auto state = fsdp::full_state_dict(fsdp);          // rank 0: the single-process names (state_dict.h)
//
// Units (wrap_policy.h): each BasicBlock or Bottleneck, the stem and the head. Each unit's
// parameters become one FlatParameter (flat_param.h); runtime.h drives their gathers, frees
// and reduce-scatters through forward and backward.
//
// Note [Why FSDP runs the stages itself]
// PyTorch's FSDP replaces each unit by an FSDP module whose __call__ gathers before and
// frees after. A parent in loom calls its children through typed members (ResNet calls
// (*fc)(x) on its own member), so replacing a child in the parent's registry would not
// intercept it. FSDP instead runs the model as its sequence of stages (wrap_policy.h:
// stages_of), unit by unit: the model's modules, and so its parameters, buffers and
// state_dict names, are unchanged, and the units' own forward hooks (tensor parallelism's)
// still run inside them.
//
// The FSDP module's parameters() are the shards (one per unit, "flat_param_<k>"), so
// the optimizer is built over them; the wrapped module's parameters are empty between
// uses and get no gradients (Note [Did the optimizer step the shards?], runtime.cpp).
// With per_parameter_sharding (FSDP2, fully_shard.h) they are each parameter's local
// shard instead, under the wrapped module's own names ("layer1.0.conv1.weight").
// Buffers (BatchNorm's running statistics) stay replicated and are broadcast from rank
// 0 before training forwards, as DDP does.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "parallel/comm/communicator.h"
#include "parallel/fsdp/runtime.h"      // defines: ShardingStrategy, Runtime, Unit
#include "parallel/fsdp/wrap_policy.h"  // defines: ModuleWrapPolicy

namespace loom::fsdp {

struct FSDPOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::FULL_SHARD;
  ModuleWrapPolicy auto_wrap_policy{};
  // Broadcast rank 0's buffers before every training forward (DDP's broadcast_buffers).
  bool broadcast_buffers = true;
  // FULL_SHARD and HYBRID_SHARD free a unit's gathered parameters after its forward and
  // gather them again for its backward (FSDP2's reshard_after_forward=True), except the
  // last `keep_last_gathered` units with parameters, whose backwards come right after
  // the forward: see Note [Which units stay gathered], runtime.cpp. 1 keeps the last
  // unit, as PyTorch does for its root; torchtitan also keeps the last transformer
  // block, which is 2 here (the trainer's choice: the last BasicBlock). 0 frees every unit.
  int keep_last_gathered = 1;
  // FSDP2's reshard_after_forward, for FULL_SHARD and HYBRID_SHARD: false keeps every unit
  // gathered from its forward to its backward (ZeRO-2's parameters, PyTorch's
  // _HYBRID_SHARD_ZERO2 under HYBRID_SHARD). Unset: true, except under a pipeline
  // (parallel/pipeline/stage_sharding.h), where false keeps each unit gathered through
  // all the micro-batches of a step (Note [FSDP under a pipeline], runtime.cpp).
  // SHARD_GRAD_OP and NO_SHARD never free after forward: true is an error for them.
  std::optional<bool> reshard_after_forward = std::nullopt;
  // FSDP2's layout (fsdp::fully_shard sets it): every parameter cut on dim 0 rather than
  // each unit's flat buffer cut in N (Note [Per-parameter shards], per_parameter_layout.h),
  // and parameters() / named_parameters() are the local shards under the wrapped module's
  // names. The gathers and reduce-scatters stay one per unit.
  bool per_parameter_sharding = false;
};

class FullyShardedDataParallel : public nn::Module {
 public:
  // Collective over process_group: every rank constructs its FSDP at the same point.
  // FULL_SHARD and SHARD_GRAD_OP shard over process_group; NO_SHARD all-reduces over it.
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<distributed::Communicator> process_group,
                           FSDPOptions options = {});
  // HYBRID_SHARD, as PyTorch's tuple form process_group=(shard_group, replicate_group):
  // shard within the first, all-reduce the shards' gradients across the second. Every
  // shard group must be one replica (its ranks share a replicate-group rank) and every
  // replicate group must hold the same shard of each unit (its ranks share a shard-group
  // rank); anything else is an error naming the ranks.
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module,
                           std::pair<std::shared_ptr<distributed::Communicator>,
                                     std::shared_ptr<distributed::Communicator>> process_groups,
                           FSDPOptions options);

  Tensor forward(const Tensor& input) override;
  // Also sets the wrapped module's mode (it is not a registered child; see above). Set
  // through a Module& (not virtual), the mode reaches the wrapped module at the next forward.
  void train(bool on = true);
  void eval() { train(false); }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  ShardingStrategy sharding_strategy() const { return options_.sharding_strategy; }
  bool per_parameter_sharding() const { return options_.per_parameter_sharding; }
  const std::vector<Unit>& units() const { return runtime_->units(); }
  Runtime& runtime() const { return *runtime_; }
  // The group each unit is sharded over (null for NO_SHARD) and the one its gradients are
  // all-reduced over (null for FULL_SHARD and SHARD_GRAD_OP).
  const std::shared_ptr<distributed::Communicator>& shard_group() const { return shard_group_; }
  const std::shared_ptr<distributed::Communicator>& replicate_group() const { return replicate_group_; }

  // RAII, as PyTorch's `with fsdp.no_sync():` — backwards inside accumulate full
  // gradients on the module's parameters, without communication; the next synchronised
  // backward reduces the accumulated sum.
  class NoSync {
   public:
    explicit NoSync(FullyShardedDataParallel& fsdp) : runtime_(*fsdp.runtime_), previous_(runtime_.sync()) {
      runtime_.set_sync(false);
    }
    ~NoSync() { runtime_.set_sync(previous_); }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    Runtime& runtime_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  // FSDP2's names for the same switch, and for keeping units gathered after a backward
  // that does not reduce (Runtime; Note [FSDP under a pipeline], runtime.cpp). Gradient
  // accumulation over micro-batches: every backward but the last with false.
  void set_requires_gradient_sync(bool sync) { runtime_->set_sync(sync); }
  void set_reshard_after_backward(bool on) { runtime_->set_reshard_after_backward(on); }

  // Rank 0's buffers to every rank (both groups under HYBRID_SHARD). Collective.
  void sync_buffers();

 private:
  void build(FSDPOptions options);
  // Per-parameter layout: the local shards registered under the wrapped module's names.
  void register_local_shards();
  // Every rank's shapes checked, then rank 0's values broadcast, over each group in turn.
  void broadcast_from_rank0(const std::vector<Tensor>& tensors, const std::vector<std::string>& names,
                            const char* what, bool check_shapes);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<distributed::Communicator> shard_group_, replicate_group_;
  FSDPOptions options_;
  std::shared_ptr<Runtime> runtime_;
  std::vector<Tensor> buffers_;
  std::vector<std::string> buffer_names_;
  bool require_forward_param_sync_ = true;  // as DDP: broadcast buffers after a synchronised training forward
};

// HYBRID_SHARD's group sizes for a world: shard_group_size must divide world_size
// (a loom::Error naming both otherwise). Returns the number of replicas.
int replicas_for(int world_size, int shard_group_size);

}  // namespace loom::fsdp
