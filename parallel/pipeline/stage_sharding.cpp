#include "parallel/pipeline/stage_sharding.h"

#include <functional>
#include <map>  // defines: std::map (gather_stage_weights: this rank's virtual stages, whole)

#include "autograd/grad_mode.h"          // defines: NoGradGuard
#include "core/error.h"                  // defines: LOOM_CHECK
#include "parallel/fsdp/state_dict.h"    // defines: full_state_dict (gather_stage_weights)
#include "parallel/model_parallel.h"     // defines: split_module
#include "parallel/pipeline/schedule.h"  // defines: virtual_stage

namespace loom::parallel::pipeline {

using fsdp::FullyShardedDataParallel;

StageShards shard_stage(PipelineStage& stage, fsdp::FSDPOptions options, const MakeFSDP& make) {
  // Under a pipeline a unit stays gathered through the step unless asked otherwise:
  // torchtitan's reshard_after_forward = not pp_enabled (Note [FSDP under a pipeline],
  // runtime.cpp).
  const bool reshard_after_forward = options.reshard_after_forward.value_or(false);
  options.reshard_after_forward = reshard_after_forward;
  // FSDP broadcasts buffers before a training forward that follows a synchronised one.
  // Here a step runs a forward per micro-batch, and a broadcast between them would
  // overwrite the statistics the replicas' earlier micro-batches accumulated: so, as
  // replicate_stage, the replicas take rank 0's buffers once, after the step.
  const bool broadcast_buffers = options.broadcast_buffers;
  options.broadcast_buffers = false;

  StageShards shards;
  const auto pieces = stage.local_virtual_stages();
  for (size_t local = 0; local < pieces.size(); ++local) {
    // A virtual stage without parameters to train (a ReLU, a Flatten) has nothing to shard.
    if (!has_trainable_parameters(*pieces[local])) {
      shards.push_back(nullptr);
      continue;
    }
    shards.push_back(make(pieces[local], options));
    stage.wrap_virtual_stage(local, shards.back());
  }
  stage.set_gradient_sync({
      .after_step = [shards, broadcast_buffers] {
        if (!broadcast_buffers) return;
        for (const auto& fsdp : shards)
          if (fsdp && !fsdp->module()->buffers().empty()) fsdp->sync_buffers();
      },
      .before_backward = [shards, reshard_after_forward](size_t local, bool last_backward) {
        // See Note [FSDP under a pipeline] (runtime.cpp): the virtual stage's last backward of the
        // step reduce-scatters what the earlier ones accumulated, and frees the units.
        const auto& fsdp = shards.at(local);
        if (!fsdp) return;
        fsdp->set_requires_gradient_sync(last_backward);
        fsdp->set_reshard_after_backward(last_backward || reshard_after_forward);
      },
  });
  return shards;
}

StageShards shard_stage(PipelineStage& stage, std::shared_ptr<distributed::Communicator> shard_group,
                        fsdp::FSDPOptions options) {
  return shard_stage(stage, std::move(options), [&](std::shared_ptr<nn::Module> piece, fsdp::FSDPOptions o) {
    return std::make_shared<FullyShardedDataParallel>(std::move(piece), shard_group, std::move(o));
  });
}

StageShards shard_stage(PipelineStage& stage,
                        std::pair<std::shared_ptr<distributed::Communicator>,
                                  std::shared_ptr<distributed::Communicator>> process_groups,
                        fsdp::FSDPOptions options) {
  return shard_stage(stage, std::move(options), [&](std::shared_ptr<nn::Module> piece, fsdp::FSDPOptions o) {
    return std::make_shared<FullyShardedDataParallel>(std::move(piece), process_groups, std::move(o));
  });
}

void gather_stage_weights(PipelineStage& stage, const StageShards& shards, nn::Sequential& whole) {
  const int64_t stages = stage.num_stages(), me = stage.stage_index();
  const std::vector<std::shared_ptr<nn::Sequential>> pieces = split_module(whole, stage.balance());
  const std::vector<std::shared_ptr<nn::Sequential>> locals = stage.local_virtual_stages();
  LOOM_CHECK(shards.size() == locals.size(), "gather_stage_weights: ", shards.size(), " shards for the stage's ",
             locals.size(), " local pieces; pass what shard_stage returned");
  NoGradGuard no_grad;
  // This rank's virtual stages, whole: gathered from the shards (a collective within each virtual stage's
  // FSDP groups, whose ranks hold the same virtual stages), or the virtual stage's own state.
  std::map<int64_t, OrderedDict<Tensor>> mine;
  for (size_t v = 0; v < locals.size(); ++v)
    mine[virtual_stage(me, int64_t(v), stages)] =
        shards[v] ? fsdp::full_state_dict(*shards[v], /*rank0_only=*/false) : locals[v]->state_dict();
  distributed::Communicator& group = *stage.group();
  for (int64_t c = 0; c < static_cast<int64_t>(pieces.size()); ++c) {
    const int owner = static_cast<int>(c % stages);
    for (const auto& [key, t] : pieces[size_t(c)]->state_dict()) {
      const Tensor* own = owner == me ? mine.at(c).find(key) : &t;
      LOOM_CHECK(own != nullptr, "gather_stage_weights: virtual stage ", c, " has no '", key, "' on its own stage");
      Tensor buffer = own->detach().contiguous().clone().to(group.tensor_device());
      group.broadcast(buffer, owner)->wait();
      Tensor(t).copy_(buffer.to(t.device()));
    }
  }
}

}  // namespace loom::parallel::pipeline
