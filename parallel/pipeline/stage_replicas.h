// Data parallelism for a pipeline stage: the second dimension of pp x dp (torchtitan's
// pipeline with data parallelism on each stage). On a DeviceMesh ("pp", "dp"), the ranks
// that hold the same stage of different pipelines are that stage's replicas; each reads
// its own shard of the data and averages its gradients with the others before the step.
//
//   DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"pp", "dp"});
//   PipelineStage stage(model->sequential(), balance, mesh.group("pp"), device, n_microbatches, "1f1b", loss);
//   replicate_stage(stage, mesh.group("dp"));      // a collective over the dp group
//   optim::SGD opt(stage.parameters(), ...);
//   stage.step(images, labels);                    // gradients averaged over the replicas
//
// Each of the stage's virtual stages gets a DistributedDataParallel of its own over the
// dp group: it checks that the replicas built the same layers, broadcasts the dp group's
// rank 0's parameters and buffers, and owns the reducer (buckets and gradient hooks). The
// stage runs the layers itself and tells the reducer which of its backwards to
// synchronise: only the last one of each step (Note [A replicated stage synchronises
// once], pipeline_stage.h). After every step the replicas take rank 0's buffers
// (BatchNorm's running statistics), as DDP's next forward would make them.
#pragma once

#include <memory>

#include "parallel/comm/communicator.h"              // defines: Communicator
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DDPOptions
#include "parallel/pipeline/pipeline_stage.h"        // defines: PipelineStage

namespace loom::parallel::pipeline {

// Virtual stages without parameters to train (a ReLU and a Flatten) have nothing to
// average and are left alone. A collective over `dp_group`: every replica calls it at the same point.
void replicate_stage(PipelineStage& stage, std::shared_ptr<distributed::Communicator> dp_group,
                     ddp::DDPOptions options = {});

}  // namespace loom::parallel::pipeline
