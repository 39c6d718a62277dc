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
//   ParallelModel parallel = parallelize(model, dims, &mesh, config, device, criterion);
//   optim::SGD optimizer(parallel.module->parameters(), ...);   // this rank's parameters
//
// The loop then calls parallel.module (forward) or, under a pipeline, parallel.pipeline_step
// (forward and backward of the whole batch, the schedule's): that is its one branch, as
// torchtitan's train_step. It never asks which wrapper it got.
#pragma once

#include <functional>
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
#include "parallel/pipeline/step_result.h"     // defines: StepResult (a pipeline's step)
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DDPOptions
#include "parallel/tensor/parallel_style.h"     // defines: StatePlacements (--tp)

namespace loom::training {

struct ParallelModel {
  // The plain model: its parameters' names (checkpoints, --save), and what a pipeline's
  // ranks evaluate once gather_weights has given each of them the whole model.
  std::shared_ptr<nn::Module> model;
  // What the loop calls, and whose parameters() this rank's optimizer steps: the model,
  // or its wrapper (DataParallel, DDP, FSDP, ModelParallel, Pipeline), or --pp's stage.
  std::shared_ptr<nn::Module> module;
  // Under a pipeline (--pp, --mode pipeline): forward and backward of one batch.
  std::function<parallel::pipeline::StepResult(const Tensor& input, const Tensor& target, double loss_scale)>
      pipeline_step;
  // --pp: `whole` made whole on every rank (each stage's weights broadcast from its owner).
  std::function<void()> gather_weights;
  // What holds the whole model after gather_weights: the model itself, or under --pp
  // with --dp-shard a copy (the stages' own layers run through FSDP and hold shards).
  std::shared_ptr<nn::Module> whole;
  // --dp-shard: the FSDP modules, and the prefix each one's state goes under in a sharded
  // checkpoint: one for the whole model (""), or one per virtual stage of a stage.
  struct ShardedPart {
    std::string prefix;
    std::shared_ptr<fsdp::FullyShardedDataParallel> fsdp;
  };
  std::vector<ShardedPart> sharded_parts;
  // --tp: how each split tensor of `model` (and `whole`) is cut over the "tp" ranks; empty
  // without tensor parallelism.
  distributed::StatePlacements tp_placements;

  // The module to evaluate: the module the loop calls, or under --pp the whole model.
  nn::Module& for_evaluation();
  // The FSDP of the whole model (--dp-shard without --pp), else null.
  fsdp::FullyShardedDataParallel* whole_model_fsdp() const;
};

// --pp: this process's stage of the pipeline over mesh "pp" (parallel/pipeline/
// pipeline_processes.h); --balance agreed over the world; --microbatches micro-batches
// under --pipeline-schedule (--virtual-stages virtual stages per stage).
std::shared_ptr<parallel::pipeline::PipelineStage> apply_pipeline(nn::Module& model,
                                                                  std::shared_ptr<distributed::Communicator> pp_group,
                                                                  const distributed::ParallelDims& dims,
                                                                  const TrainConfig& config, Device device,
                                                                  nn::CrossEntropyLoss& criterion);

// ac: --activation-checkpoint full marks every block (the types FSDP makes units of:
// residual blocks, encoder layers), selective every --selective-ac-option-th, for
// nn::checkpoint (Note [Activation checkpointing], nn/checkpoint.h); none marks nothing.
// Returns the names marked.
std::vector<std::string> apply_ac(nn::Module& model, const TrainConfig& config);

// tp: the model's plan over `tp_group`, in place (a ResNet's: conv1 column-parallel, bn1 on
// its channels, conv2 row-parallel, in every block; a ViT's: attention by heads, the MLP by
// features); the split tensors' placements.
distributed::StatePlacements apply_tp(nn::Module& model, std::shared_ptr<distributed::Communicator> tp_group,
                                      const TrainConfig& config);

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
// (ParallelDims::build_mesh) is null in one process.
ParallelModel parallelize(std::shared_ptr<nn::Module> model, const distributed::ParallelDims& dims,
                          const distributed::DeviceMesh* mesh, const TrainConfig& config, Device device,
                          nn::CrossEntropyLoss& criterion);

}  // namespace loom::training
