// Flags are degrees: train_cifar10's --pp, --dp-replicate, --dp-shard and --tp are the
// four degrees of ParallelDims (parallel/parallel_dims.h), and --mode is a preset that
// sets some of them, as torchtitan's config sets parallel_dims:
//
//   flag                      degree          torchtitan (parallelism.*)            wrapper
//   --pp P                    pp              pipeline_parallel_degree              PipelineStage per process
//   --dp-replicate R          dp_replicate    data_parallel_replicate_degree        DistributedDataParallel
//   --dp-shard S (-1: infer)  dp_shard        data_parallel_shard_degree            FullyShardedDataParallel
//   --tp T                    tp              tensor_parallel_degree
//   --mode ddp                dp_replicate = world / (pp · tp)
//   --mode fsdp               dp_shard = -1 (world / (pp · dp_replicate · tp)); hybrid_shard with
//                             --shard-group-size G: dp_shard = G, dp_replicate = the rest
//   --mode dp | mp | pipeline one process over several devices: dp_devices, mp_stages
//
// A preset and a degree that contradict it are one error naming both. The degrees are
// validated once, by ParallelDims::make; nothing else in the trainer decides what is
// parallel.
#pragma once

#include "train/trainer.h"  // defines: TrainConfig
#include "parallel/parallel_dims.h"  // defines: ParallelDims

namespace loom::training {

// Whether the run spans processes (a process group): --mode ddp or fsdp, or any degree
// across processes above 1 (or --dp-shard -1).
bool needs_process_group(const TrainConfig& config);

// The degrees the flags ask for on a world of `world_size` processes, validated.
distributed::ParallelDims parallel_dims_from_flags(const TrainConfig& config, int world_size);

}  // namespace loom::training
