// ParallelDims: how parallel a run is, as torchtitan's ParallelDims: four degrees,
// validated once, and the one DeviceMesh every parallelism takes its groups from.
//
//   // loomrun --nproc_per_node 8 ./train --pp 2 --dp-shard -1 --tp 2
//   auto dims = ParallelDims::make({.pp = 2, .dp_replicate = 1, .dp_shard = -1, .tp = 2}, /*world_size=*/8);
//   dims.str();                    // "pp=2 dp_replicate=1 dp_shard=2 tp=2 (world 8)"
//   DeviceMesh mesh = dims.build_mesh("cpu");          // dims [pp, dp_shard, tp]: a collective
//   if (dims.dp_shard_enabled()) apply_fsdp(part, mesh.group("dp_shard"));
//   auto at = dims.coordinates(rank);                  // {pp 1, dp_replicate 0, dp_shard 0, tp 1}
//   DistributedSampler sampler(n, dims.batch_size(), at.batch, ...);   // tp peers read alike
//
// Note [The mesh's order: pp, dp_replicate, dp_shard, tp]
// World rank = ((pp · R + dp_replicate) · S + dp_shard) · T + tp, row-major as
// DeviceMesh, so the innermost dimension's ranks are consecutive: on one machine
// under loomrun, and for NCCL on one NVLink island. Tensor parallelism is innermost
// because it communicates inside every layer; then sharded data parallelism (gathers in
// every forward), replicas (one all-reduce a step), and pipeline stages outermost (point
// to point, one activation per micro-batch). torchtitan builds the same order.
//
// Note [Every rank coordinate comes from the mesh]
// A rank's place (its stage, its data shard, its tensor-parallel slice) is read off
// coordinates(), which is the mesh's row-major layout, and nowhere else computed with %
// and /. The data a rank reads is its coordinate along "batch" = (dp_replicate,
// dp_shard) flattened: the ranks of one tensor-parallel group and of one pipeline (same
// batch coordinate, other pp or tp) read the same shard, which a rank arithmetic that
// forgot a dimension would silently break.
//
// A degree of 1 is no mesh dimension (torchtitan builds only the enabled ones), so a
// parallelism asks for its group only where its *_enabled() predicate holds. The named
// flattened groups: "batch" (dp_replicate × dp_shard: the data-parallel ranks a batch is
// split over, and the group SyncBatchNorm and ZeRO span) and "loss" (the ranks whose
// metrics are averaged; the same ranks here, as torchtitan's without context parallel).
#pragma once

#include <string>

#include "parallel/device_mesh.h"  // defines: DeviceMesh

namespace loom::distributed {

struct ParallelDims {
  // The degrees. dp_shard = -1 in make(): whatever the world leaves (torchtitan's default).
  int pp = 1;
  int dp_replicate = 1;
  int dp_shard = 1;
  int tp = 1;
  int world_size = 1;
  // In one process, over several devices (no process group; world 1):
  int dp_devices = 1;  // DataParallel replicas, one device each
  int mp_stages = 1;   // model-parallel or pipeline stages, one device each
  bool mp_microbatched = false;  // the mp stages run micro-batches under a schedule (a Pipeline), not layer-wise

  // Checks each degree (>= 1; dp_shard may be -1 to infer) and that their product is the
  // world size, inferring dp_shard = world / (pp · dp_replicate · tp). Every error names
  // every factor and the world size. The in-process degrees need a world of one process.
  static ParallelDims make(const ParallelDims& degrees, int world_size);

  bool pp_enabled() const { return pp > 1; }
  bool dp_replicate_enabled() const { return dp_replicate > 1; }
  bool dp_shard_enabled() const { return dp_shard > 1; }  // FSDP (HSDP with dp_replicate)
  bool fsdp_enabled() const { return dp_shard_enabled(); }
  bool tp_enabled() const { return tp > 1; }
  bool dp_enabled() const { return batch_size() > 1; }  // the batch is split over ranks
  bool dp_devices_enabled() const { return dp_devices > 1; }
  bool mp_enabled() const { return mp_stages > 1; }
  bool in_process_pipeline_enabled() const { return mp_enabled() && mp_microbatched; }
  // How many shards every batch is split into: the data-parallel degree.
  int batch_size() const { return dp_replicate * dp_shard; }

  // A world rank's place, read off the mesh's layout (Note [Every rank coordinate comes
  // from the mesh]): its index along each dimension, and along "batch".
  struct Coordinates {
    int pp = 0, dp_replicate = 0, dp_shard = 0, tp = 0;
    int batch = 0;  // dp_replicate · dp_shard_degree + dp_shard: which data shard it reads
  };
  Coordinates coordinates(int world_rank) const;

  // The enabled dimensions, outermost first, and their degrees: the mesh's shape.
  std::vector<std::string> mesh_dim_names() const;
  std::vector<int> mesh_shape() const;

  // The mesh of the enabled dimensions (with no dimension enabled: a one-rank
  // "dp_replicate" mesh) plus the flattened "batch" and "loss" groups where the batch is
  // split: a collective over the world, every group made in the same order on every rank.
  DeviceMesh build_mesh(const std::string& device_type, int rank, const DeviceMesh::GroupMaker& make_group) const;
  DeviceMesh build_mesh(const std::string& device_type, World& world) const;
  // Over the default process group; a dimension spanning the whole world is the default
  // group itself, as in PyTorch's one-dimensional meshes.
  DeviceMesh build_mesh(const std::string& device_type) const;

  // "pp=2 dp_replicate=1 dp_shard=2 tp=1 (world 4)", as the trainer prints it.
  std::string str() const;

  // Every rank's place as a picture: one block per pipeline stage, a row per data shard
  // (batch coordinate, with its dp_replicate and dp_shard), a column per tp rank:
  //   pp 1                        tp 0     tp 1
  //     batch 0 (dp_replicate 0, dp_shard 0)   rank 4   rank 5
  std::string draw() const;
};

}  // namespace loom::distributed
