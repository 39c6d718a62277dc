#include "parallel/pipeline/stage_sharding.h"

#include <functional>

namespace loom::parallel::pipeline {

namespace {

using fsdp::FullyShardedDataParallel;

bool has_trainable_parameters(nn::Module& module) {
  for (const Tensor& p : module.parameters())
    if (p.requires_grad()) return true;
  return false;
}

using MakeFSDP = std::function<std::shared_ptr<FullyShardedDataParallel>(std::shared_ptr<nn::Module>,
                                                                          fsdp::FSDPOptions)>;

StageShards shard_chunks(PipelineStage& stage, fsdp::FSDPOptions options, const MakeFSDP& make) {
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
  const auto chunks = stage.local_chunks();
  for (size_t local = 0; local < chunks.size(); ++local) {
    // A chunk without parameters to train (a ReLU, a Flatten) has nothing to shard.
    if (!has_trainable_parameters(*chunks[local])) {
      shards.push_back(nullptr);
      continue;
    }
    shards.push_back(make(chunks[local], options));
    stage.wrap_chunk(local, shards.back());
  }
  stage.set_gradient_sync({
      .after_step = [shards, broadcast_buffers] {
        if (!broadcast_buffers) return;
        for (const auto& fsdp : shards)
          if (fsdp && !fsdp->module()->buffers().empty()) fsdp->sync_buffers();
      },
      .before_backward = [shards, reshard_after_forward](size_t local_chunk, bool last_backward) {
        // See Note [FSDP under a pipeline] (runtime.cpp): the chunk's last backward of the
        // step reduce-scatters what the earlier ones accumulated, and frees the units.
        const auto& fsdp = shards.at(local_chunk);
        if (!fsdp) return;
        fsdp->set_requires_gradient_sync(last_backward);
        fsdp->set_reshard_after_backward(last_backward || reshard_after_forward);
      },
  });
  return shards;
}

}  // namespace

StageShards shard_stage(PipelineStage& stage, std::shared_ptr<distributed::Communicator> shard_group,
                        fsdp::FSDPOptions options) {
  return shard_chunks(stage, std::move(options), [&](std::shared_ptr<nn::Module> chunk, fsdp::FSDPOptions o) {
    return std::make_shared<FullyShardedDataParallel>(std::move(chunk), shard_group, std::move(o));
  });
}

StageShards shard_stage(PipelineStage& stage,
                        std::pair<std::shared_ptr<distributed::Communicator>,
                                  std::shared_ptr<distributed::Communicator>> process_groups,
                        fsdp::FSDPOptions options) {
  return shard_chunks(stage, std::move(options), [&](std::shared_ptr<nn::Module> chunk, fsdp::FSDPOptions o) {
    return std::make_shared<FullyShardedDataParallel>(std::move(chunk), process_groups, std::move(o));
  });
}

}  // namespace loom::parallel::pipeline
