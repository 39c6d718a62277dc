// ParallelDims: how parallel this run is, decided once, from the flags, as torchtitan's
// ParallelDims. Nothing else in the trainer decides what is parallel: the loop asks
// `parallelize` (parallelize.h) for the module to call and this struct for the shard of
// data a rank reads.
//
//   Across processes (under loomrun), world size = pp x dp_replicate x dp_shard:
//     pp            --pp P: pipeline stages, one process each
//     dp_replicate  --mode ddp: replicas of the model (DistributedDataParallel)
//     dp_shard      --mode fsdp: shards of the model (FullyShardedDataParallel)
//   Inside one process, over several devices (no process group):
//     dp_devices    --mode dp: DataParallel
//     mp_stages     --mode mp | pipeline: the model cut into stages, one device each
//
// How torchtitan's flags map: --parallelism.pipeline_parallel_degree is --pp,
// data_parallel_replicate_degree is dp_replicate (loom: --mode ddp), and
// data_parallel_shard_degree is dp_shard (loom: --mode fsdp). A degree left to be
// inferred (-1 in torchtitan) is the data-parallel one here: world / pp.
//
// The mesh's dimensions are the process degrees above 1, outermost first: ("pp",
// "dp_replicate", "dp_shard"). Row-major, so the ranks of one pipeline stage's data
// parallel group are consecutive (Note in parallel/device_mesh.h: the heaviest traffic
// innermost).
#pragma once

#include <memory>
#include <string>

#include "examples/train/trainer.h"  // defines: TrainConfig
#include "parallel/device_mesh.h"    // defines: DeviceMesh

namespace loom::examples {

struct ParallelDims {
  int pp = 1;
  int dp_replicate = 1;
  int dp_shard = 1;
  int dp_devices = 1;
  int mp_stages = 1;
  int world_size = 1;

  // The degrees --mode, --pp and the world size ask for; a loom::Error naming the flags
  // and every factor when they do not multiply to the world size.
  static ParallelDims from_config(const TrainConfig& config, int world_size);

  // Whether the run needs a process group: any degree across processes, or --mode
  // ddp/fsdp at world size 1 (which still wraps the model, as PyTorch would).
  static bool needs_process_group(const TrainConfig& config);

  int dp_size() const { return dp_replicate * dp_shard; }  // how many shards the data has
  bool pp_enabled() const { return pp > 1; }

  // This world rank's data-parallel rank: which shard of every batch it reads (every
  // stage of one pipeline reads the same one).
  int dp_rank(int world_rank) const { return world_rank % dp_size(); }
  // Its pipeline stage (0 without --pp).
  int pp_rank(int world_rank) const { return world_rank / dp_size(); }

  // The mesh over the default process group (a collective). See the header comment
  // for its dimensions; with none above 1 it is the one-rank "dp_replicate" mesh.
  distributed::DeviceMesh build_mesh(const std::string& device_type) const;

  // "pp 2 x dp_replicate 2 (world 4)", for the run's first line.
  std::string str() const;
};

}  // namespace loom::examples
