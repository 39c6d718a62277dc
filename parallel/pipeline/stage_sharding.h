// Sharded data parallelism for a pipeline stage: pp x FSDP, and pp x HSDP (torchtitan
// applies FSDP to each pipeline part: the recipe for a model too large for one device).
// On a DeviceMesh ("pp", "dp_shard"), the ranks that hold the same stage of different
// pipelines split that stage's parameters, gradients and optimizer state between them;
// each reads its own shard of the data.
//
//   DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"pp", "dp_shard"});
//   PipelineStage stage(model->sequential(), balance, mesh.group("pp"), device, virtual stages, "1f1b", loss);
//   auto sharded = shard_stage(stage, mesh.group("dp_shard"));  // a collective over dp_shard
//   optim::SGD opt(stage.parameters(), ...);        // the shards: this stage's parameters / N
//   opt.zero_grad();
//   stage.step(images, labels);                     // gathers and reduce-scatters once per virtual stage
//   opt.step();
//
//   // pp x HSDP, on a mesh ("pp", "dp_replicate", "dp_shard"): shard within dp_shard,
//   // all-reduce the shards' gradients across dp_replicate.
//   shard_stage(stage, {mesh.group("dp_shard"), mesh.group("dp_replicate")},
//               {.sharding_strategy = fsdp::ShardingStrategy::HYBRID_SHARD});
//
// Each of the stage's virtual stages gets a FullyShardedDataParallel of its own over the
// group(s), which takes the virtual stage's place in the stage (PipelineStage::wrap_virtual_stage): the
// stage's parameters() become the chunk's shards, and the stage runs every micro-batch
// through it. FSDP checks that the replicas built the same virtual stage and starts them from
// the group's rank 0's parameters and buffers.
//
// What happens in a step (Note [FSDP under a pipeline], parallel/fsdp/runtime.cpp):
// with the default, reshard_after_forward unset (torchtitan's `not pp_enabled`), each
// unit of a virtual stage is gathered by the virtual stage's first forward of the step and stays
// gathered; the backwards accumulate full gradients locally but the virtual stage's last, which
// reduce-scatters their sum, once per unit (then all-reduces it across dp_replicate
// under HYBRID_SHARD), and frees the unit. {.reshard_after_forward = true} is FULL_SHARD
// per micro-batch: every forward and every backward gathers its units and frees them
// after, 2M gathers per unit and step for M micro-batches instead of one, for the least
// memory. Buffers (BatchNorm's running statistics) are broadcast from rank 0 after every
// step, as replicate_stage does (FSDPOptions::broadcast_buffers).
//
// Under pp x ZeRO-1 the stage is replicated instead (stage_replicas.h) and the optimizer
// sharded over the stage's own parameters:
//
//   replicate_stage(stage, mesh.group("dp"));
//   ZeroRedundancyOptimizer opt(stage.parameters(), optimizer_class<optim::SGD>(sgd_options), mesh.group("dp"));
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "parallel/comm/communicator.h"                  // defines: Communicator
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel, FSDPOptions
#include "parallel/pipeline/pipeline_stage.h"            // defines: PipelineStage

namespace loom::parallel::pipeline {

using StageShards = std::vector<std::shared_ptr<fsdp::FullyShardedDataParallel>>;

// FULL_SHARD (or SHARD_GRAD_OP, NO_SHARD) of each local virtual stage over `shard_group`.
// Returns the FSDP of each local virtual stage (local_virtual_stages()' order; null for a virtual stage without
// parameters to train, which is left alone): for checkpoints (fsdp::full_state_dict),
// memory and traffic figures. A collective over the group: every replica calls it at the
// same point.
StageShards shard_stage(PipelineStage& stage, std::shared_ptr<distributed::Communicator> shard_group,
                        fsdp::FSDPOptions options = {});
// Each virtual stage through `make` (the caller's own FSDP construction: a trainer's
// apply_fsdp, so that a stage's parts are wrapped as its whole models are), with `options`
// adjusted for a pipeline first (Note [FSDP under a pipeline]).
using MakeFSDP = std::function<std::shared_ptr<fsdp::FullyShardedDataParallel>(std::shared_ptr<nn::Module> part,
                                                                              fsdp::FSDPOptions options)>;
StageShards shard_stage(PipelineStage& stage, fsdp::FSDPOptions options, const MakeFSDP& make);
// HYBRID_SHARD: (shard group, replicate group), as FullyShardedDataParallel's pair form.
StageShards shard_stage(PipelineStage& stage,
                        std::pair<std::shared_ptr<distributed::Communicator>,
                                  std::shared_ptr<distributed::Communicator>> process_groups,
                        fsdp::FSDPOptions options = {.sharding_strategy = fsdp::ShardingStrategy::HYBRID_SHARD});

// Every rank's `whole` (the whole model as a Sequential, built alike on every rank, apart
// from the stage: e.g. a clone of the model made before the stage was sharded) gets every
// virtual stage's full parameters and buffers from a rank of the stage that trains it:
// local virtual stages' shards gathered within their FSDP group (fsdp::full_state_dict), then each
// virtual stage broadcast over the pipeline group from its owner. For evaluating or saving the
// whole model under pp x FSDP, where share_weights cannot read the virtual stages' parameters.
// A collective over the pipeline group and every virtual stage's FSDP groups.
void gather_stage_weights(PipelineStage& stage, const StageShards& shards, nn::Sequential& whole);

}  // namespace loom::parallel::pipeline
