#include "parallel/pipeline/stage_replicas.h"

#include <vector>

namespace loom::parallel::pipeline {

void replicate_stage(PipelineStage& stage, std::shared_ptr<distributed::Communicator> dp_group,
                     ddp::DDPOptions options) {
  // [local stage] -> its replica's DDP, or null for a virtual stage with nothing to train.
  std::vector<std::shared_ptr<ddp::DistributedDataParallel>> replicas;
  for (const auto& layers : stage.local_virtual_stages())
    replicas.push_back(has_trainable_parameters(*layers)
                           ? std::make_shared<ddp::DistributedDataParallel>(layers, dp_group, options)
                           : nullptr);
  stage.set_gradient_sync({
      .after_step = [replicas] {
        for (const auto& replica : replicas)
          if (replica) replica->sync_buffers();
      },
      .before_backward = [replicas](size_t local_stage, bool last_backward) {
        // See Note [A replicated stage synchronises once] (pipeline_stage.h).
        const auto& replica = replicas.at(local_stage);
        if (!replica) return;
        if (last_backward) replica->reducer().prepare_for_backward({});
        else replica->reducer().prepare_for_local_backward();
      },
  });
}

}  // namespace loom::parallel::pipeline
