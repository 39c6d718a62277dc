#include "train/degrees.h"

#include "core/error.h"                                 // defines: LOOM_CHECK
#include "cuda/device.h"                                // defines: cuda::device_count (--dp-devices 0)
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: parse_sharding_strategy, replicas_for

namespace loom::training {

namespace {

bool in_process_mode(const std::string& mode) { return mode == "dp" || mode == "mp" || mode == "pipeline"; }

// world / others, or an error naming the flag that asked for the division.
int what_is_left(int world_size, int others, const std::string& what) {
  LOOM_CHECK(others >= 1 && world_size % others == 0, what, ": the ", world_size, " processes must split into groups ",
             "of ", others, ", but ", world_size, " is not a multiple of ", others, "; start a multiple of ", others,
             " processes (loomrun --nproc_per_node)");
  return world_size / others;
}

}  // namespace

bool needs_process_group(const TrainConfig& c) {
  return c.parallel.mode == "ddp" || c.parallel.mode == "fsdp" || c.parallel.pp > 1 || c.parallel.dp_replicate > 1 ||
         c.parallel.dp_shard > 1 || c.parallel.dp_shard == -1 || c.parallel.tp > 1;
}

distributed::ParallelDims parallel_dims_from_flags(const TrainConfig& c, int world_size) {
  LOOM_CHECK(c.parallel.pp >= 1 && c.parallel.tp >= 1 && c.parallel.dp_replicate >= 0 &&
                 (c.parallel.dp_shard >= 0 || c.parallel.dp_shard == -1),
             "--pp, --tp and --dp-replicate take a degree of at least 1, --dp-shard at least 1 or -1 (infer); got "
             "--pp ", c.parallel.pp, " --dp-replicate ", c.parallel.dp_replicate, " --dp-shard ", c.parallel.dp_shard, " --tp ",
             c.parallel.tp);
  distributed::ParallelDims d;
  d.pp = static_cast<int>(c.parallel.pp);
  d.tp = static_cast<int>(c.parallel.tp);
  d.dp_replicate = c.parallel.dp_replicate > 0 ? static_cast<int>(c.parallel.dp_replicate) : 1;
  d.dp_shard = c.parallel.dp_shard != 0 ? static_cast<int>(c.parallel.dp_shard) : 1;
  const bool hybrid =
      fsdp::parse_sharding_strategy(c.parallel.sharding_strategy) == fsdp::ShardingStrategy::HYBRID_SHARD;
  LOOM_CHECK(!hybrid || c.parallel.mode == "fsdp",
             "--sharding-strategy hybrid_shard is a --mode fsdp preset; without "
             "--mode give --dp-replicate R --dp-shard S (HSDP)");
  if (c.parallel.mode == "ddp") {
    // --mode ddp: replicas. Shards contradict it.
    LOOM_CHECK(c.parallel.dp_shard == 0 || c.parallel.dp_shard == 1,
               "--mode ddp replicates the model (--dp-replicate), but --dp-shard ", c.parallel.dp_shard,
               " asks for shards of it; drop --mode ddp (the degrees alone say it), or use --mode fsdp");
    if (c.parallel.dp_replicate == 0)
      d.dp_replicate = what_is_left(world_size, d.pp * d.tp, "--mode ddp --pp " + std::to_string(d.pp));
  } else if (c.parallel.mode == "fsdp") {
    if (hybrid) {
      LOOM_CHECK(c.parallel.shard_group_size > 0,
                 "--sharding-strategy hybrid_shard needs --shard-group-size N (ranks per "
                 "shard group)");
      LOOM_CHECK(c.parallel.dp_shard == 0 && c.parallel.dp_replicate == 0,
                 "--sharding-strategy hybrid_shard --shard-group-size ", c.parallel.shard_group_size,
                 " sets dp_shard and dp_replicate; drop --dp-shard and --dp-replicate (or give "
                 "those two without --mode)");
      d.dp_shard = static_cast<int>(c.parallel.shard_group_size);
      d.dp_replicate = fsdp::replicas_for(world_size / (d.pp * d.tp), d.dp_shard);
    } else {
      LOOM_CHECK(c.parallel.shard_group_size == 0,
                 "--shard-group-size is for --sharding-strategy hybrid_shard, got "
                 "--sharding-strategy ",
                 c.parallel.sharding_strategy);
      if (c.parallel.dp_shard == 0) d.dp_shard = -1;  // what the world leaves
    }
  } else {
    LOOM_CHECK(c.parallel.shard_group_size == 0,
               "--shard-group-size is for --mode fsdp --sharding-strategy hybrid_shard");
  }
  if (in_process_mode(c.parallel.mode) && !(c.parallel.mode == "pipeline" && c.parallel.pp > 1)) {
    LOOM_CHECK(c.parallel.dp_replicate <= 1 && (c.parallel.dp_shard == 0 || c.parallel.dp_shard == 1) &&
                   c.parallel.pp == 1 && c.parallel.tp == 1,
               "--mode ", c.parallel.mode,
               " runs in one process over several devices; it does not combine with --pp, --tp, "
               "--dp-replicate or --dp-shard (across processes)");
    // --dp-devices 0: every GPU with --device cuda, cpu:0 and cpu:1 on the CPU.
    if (c.parallel.mode == "dp")
      d.dp_devices = static_cast<int>(c.parallel.dp_devices > 0             ? c.parallel.dp_devices
                                      : Device(c.training.device).is_cuda() ? cuda::device_count()
                                                                            : 2);
    else {
      d.mp_stages = static_cast<int>(c.parallel.mp_devices);
      d.mp_microbatched = c.parallel.mode == "pipeline";
    }
  }
  return distributed::ParallelDims::make(d, world_size);
}

}  // namespace loom::training
