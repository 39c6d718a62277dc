// parallelize: one function per parallelism, each over a plain model, as torchtitan's
// parallelize.py, applied in its order and chosen by ParallelDims' predicates alone:
//
//   ac        mark blocks for activation checkpointing, in place (apply_ac): every cut
//             and wrapper below runs the same modules, so they keep the marks
//   pp        split the model into pipeline stages first, one per process (apply_pipeline)
//   tp        split each block's layers over the mesh's "tp" ranks (apply_tp)
//   ...       then, on each part (the stage's virtual stages, or the whole model):
//   dp_shard  FullyShardedDataParallel (HSDP with dp_replicate)   apply_fsdp
//   dp_replicate  DistributedDataParallel (+ ZeRO-1: build_optimizer)   apply_ddp
//   in one process: DataParallel (dp_devices), ModelParallel / Pipeline (mp_stages)
//
//   auto dims = parallel_dims_from_flags(config, world_size);   // degrees.h
//   auto mesh = dims.build_mesh("cpu");                         // under loomrun
//   ParallelModel parallel = parallelize(model, dims, &mesh, world, config, device, criterion);
//   optim::SGD optimizer(parallel.module().parameters(), ...);   // this rank's parameters
//
// The loop then calls parallel.module() (forward) or, under a pipeline, parallel.pipeline()
// (forward and backward of the whole batch, the schedule's): that is its one branch, as
// torchtitan's train_step. It never asks which wrapper it got; checkpoints and clipping ask
// the ParallelModel (parallel_model.h, Note [Model parts]).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"                        // defines: Device
#include "train/trainer.h"             // defines: TrainConfig
#include "nn/loss.h"                            // defines: CrossEntropyLoss
#include "nn/module.h"                          // defines: Module
#include "parallel/device_mesh.h"               // defines: DeviceMesh
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel
#include "parallel/parallel_dims.h"             // defines: ParallelDims
#include "parallel/pipeline/pipeline_stage.h"   // defines: PipelineStage (--pp)
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DDPOptions
#include "parallel/tensor/parallel_style.h"     // defines: StatePlacements (--tp)
#include "train/parallel_model.h"               // defines: ParallelModel, ModelPart

namespace loom::training {

// --pp: this process's stage of the pipeline over mesh "pp" (parallel/pipeline/
// pipeline_processes.h); --balance agreed over `world`; --microbatches micro-batches
// under --pipeline-schedule (--virtual-stages virtual stages per stage).
std::shared_ptr<parallel::pipeline::PipelineStage> apply_pipeline(nn::Module& model,
                                                                  std::shared_ptr<distributed::Communicator> pp_group,
                                                                  std::shared_ptr<distributed::Communicator> world,
                                                                  const distributed::ParallelDims& dims,
                                                                  const TrainConfig& config, Device device,
                                                                  nn::CrossEntropyLoss& criterion);

// ac: --activation-checkpoint full marks every block (the types FSDP makes units of:
// residual blocks, encoder layers), selective every --selective-ac-option-th, for
// nn::checkpoint (Note [Activation checkpointing], nn/checkpoint.h); none marks nothing.
// Returns the names marked; with `log` (one rank of the run) says how many.
std::vector<std::string> apply_ac(nn::Module& model, const TrainConfig& config, bool log);

// tp: the model's plan over `tp_group`, in place (a ResNet's: conv1 column-parallel, bn1 on
// its channels, conv2 row-parallel, in every block; a ViT's: attention by heads, the MLP by
// features); the split tensors' placements.
distributed::StatePlacements apply_tp(nn::Module& model, std::shared_ptr<distributed::Communicator> tp_group,
                                      const TrainConfig& config, bool log);

// DDP's options from the flags (--bucket-cap-mb), for the whole model and for a
// pipeline's stage parts alike.
ddp::DDPOptions ddp_options(const TrainConfig& config);

// dp_replicate: DistributedDataParallel over `dp_group` (parallelize has converted the
// model's BatchNorms for --sync-bn first).
std::shared_ptr<nn::Module> apply_ddp(std::shared_ptr<nn::Module> model,
                                      std::shared_ptr<distributed::Communicator> dp_group, const TrainConfig& config);

// FSDP's options from the flags: --sharding-strategy (HYBRID_SHARD wherever dp_replicate
// is enabled too), the model family's blocks as units, --reshard-after-forward, --fsdp-layout.
fsdp::FSDPOptions fsdp_options(const distributed::ParallelDims& dims, const TrainConfig& config);

// dp_shard: FullyShardedDataParallel of one model part (the whole model, or a pipeline
// stage's virtual stage) over mesh "dp_shard", and across "dp_replicate" under
// HYBRID_SHARD (HSDP): options from fsdp_options.
std::shared_ptr<fsdp::FullyShardedDataParallel> apply_fsdp(std::shared_ptr<nn::Module> part,
                                                           const distributed::DeviceMesh& mesh,
                                                           fsdp::FSDPOptions options);

// The parallelisms `dims` enables, applied to `model` in the order above. `mesh`
// (ParallelDims::build_mesh) and `world` (every rank's group) are null in one process.
ParallelModel parallelize(std::shared_ptr<nn::Module> model, const distributed::ParallelDims& dims,
                          const distributed::DeviceMesh* mesh, std::shared_ptr<distributed::Communicator> world,
                          const TrainConfig& config, Device device, nn::CrossEntropyLoss& criterion);

}  // namespace loom::training
