// parallelize: one function per parallelism, each over a plain model, as torchtitan's
// parallelize.py. The training loop calls whatever module `parallelize` returns and never
// asks which mode it is in; ParallelDims (parallel_dims.h) decided that, once.
//
//   ParallelDims dims = ParallelDims::from_config(config, world_size);
//   auto mesh = dims.build_mesh("cpu");             // under loomrun
//   auto net = parallelize(model, &mesh, config, device, criterion);
//   optim::SGD optimizer(net->parameters(), ...);   // the model's own parameters
//
// Each apply_* wraps or cuts the model and returns the module the loop calls; they share
// the model's parameters, so the optimizer and checkpoints use the model's own.
#pragma once

#include <memory>

#include "core/device.h"                  // defines: Device
#include "examples/train/parallel_dims.h"  // defines: ParallelDims
#include "examples/train/trainer.h"        // defines: TrainConfig
#include "nn/loss.h"                       // defines: CrossEntropyLoss
#include "nn/module.h"                     // defines: Module
#include "parallel/device_mesh.h"          // defines: DeviceMesh
#include "parallel/pipeline/pipeline_stage.h"  // defines: PipelineStage (--pp)

namespace loom::examples {

// --mode dp: DataParallel over --dp-devices devices of --device's type, starting at the
// model's (cpu:0, cpu:1, ... are CPU virtual devices: one thread each in forward).
std::shared_ptr<nn::Module> apply_data_parallel(std::shared_ptr<nn::Module> model, const TrainConfig& config,
                                                Device device);

// --mode mp / pipeline: the ResNet as a Sequential cut into --mp-devices stages on
// consecutive devices, layer-wise (mp) or over --chunks micro-batches (pipeline).
std::shared_ptr<nn::Module> apply_model_parallel(nn::Module& model, const TrainConfig& config, Device device,
                                                 nn::CrossEntropyLoss& criterion);

// --mode pipeline --pp P (and --mode ddp --pp P): this process's stage of the pipeline
// over `pp_group` (parallel/pipeline/pipeline_processes.h): --balance, or rank 0's
// measured one; --chunks micro-batches under --pipeline-schedule (--virtual-stages chunks
// per stage).
std::shared_ptr<parallel::pipeline::PipelineStage> apply_pipeline(nn::Module& model,
                                                                  std::shared_ptr<distributed::Communicator> pp_group,
                                                                  const TrainConfig& config, Device device,
                                                                  nn::CrossEntropyLoss& criterion);

// --mode ddp: SyncBatchNorm (--sync-bn), then DistributedDataParallel over `dp_group`.
std::shared_ptr<nn::Module> apply_ddp(std::shared_ptr<nn::Module> model,
                                      std::shared_ptr<distributed::Communicator> dp_group, const TrainConfig& config);

// --mode ddp --pp P (2-D): each of the stage's model chunks data-parallel over the
// stage's replicas in `dp_group` (a DDP reducer per chunk, synchronised on the chunk's
// last backward of a step: Note [A replicated stage synchronises once]).
void apply_ddp_to_stage(parallel::pipeline::PipelineStage& stage,
                        std::shared_ptr<distributed::Communicator> dp_group, const TrainConfig& config);

// --mode fsdp: FullyShardedDataParallel with --sharding-strategy over the mesh's
// "dp_shard" dimension (hybrid_shard: and across "dp_replicate"). SyncBatchNorm (--sync-bn)
// first, over the data-parallel ranks.
std::shared_ptr<nn::Module> apply_fsdp(std::shared_ptr<nn::Module> model, const distributed::DeviceMesh& mesh,
                                       const TrainConfig& config);

// The module the loop calls: `model` itself on one device, else the apply_* the flags
// ask for. `mesh` (ParallelDims::build_mesh) is null in one process.
std::shared_ptr<nn::Module> parallelize(std::shared_ptr<nn::Module> model, const distributed::DeviceMesh* mesh,
                                        const TrainConfig& config, Device device, nn::CrossEntropyLoss& criterion);

}  // namespace loom::examples
