#include "examples/train/parallel_dims.h"

#include "core/error.h"                   // defines: LOOM_CHECK
#include "parallel/comm/process_group.h"  // defines: get_rank, get_world_size, default_group, new_group

namespace loom::examples {

bool ParallelDims::needs_process_group(const TrainConfig& config) {
  return config.mode == "ddp" || (config.mode == "pipeline" && config.pp > 1);
}

ParallelDims ParallelDims::from_config(const TrainConfig& config, int world_size) {
  ParallelDims dims;
  dims.world_size = world_size;
  if (config.mode == "dp") dims.dp_devices = static_cast<int>(config.dp_devices);
  if (config.mode == "pipeline" && config.pp > 1) dims.pp = static_cast<int>(config.pp);  // stages as processes
  else if (config.mode == "mp" || config.mode == "pipeline") dims.mp_stages = static_cast<int>(config.mp_devices);
  if (config.mode == "ddp") {  // --pp P: P stages x world / P replicas of each (2-D)
    dims.pp = static_cast<int>(config.pp);
    LOOM_CHECK(world_size % dims.pp == 0, "--mode ddp --pp ", dims.pp, ": the ", world_size, " processes must form "
               "pipelines of ", dims.pp, " stages each, but ", world_size, " is not a multiple of ", dims.pp,
               "; start a multiple of ", dims.pp, " processes (loomrun --nproc_per_node)");
    dims.dp_replicate = world_size / dims.pp;
  }
  const int product = dims.pp * dims.dp_replicate * dims.dp_shard;
  LOOM_CHECK(product == world_size, "the parallel degrees multiply to ", product, " processes (pp ", dims.pp,
             " x dp_replicate ", dims.dp_replicate, " x dp_shard ", dims.dp_shard, ") but WORLD_SIZE is ", world_size,
             "; with --mode ", config.mode, " start ", product, " processes (loomrun --nproc_per_node ", product, ")");
  return dims;
}

distributed::DeviceMesh ParallelDims::build_mesh(const std::string& device_type) const {
  std::vector<int> shape;
  std::vector<std::string> names;
  for (auto [degree, name] : {std::pair{pp, "pp"}, {dp_replicate, "dp_replicate"}, {dp_shard, "dp_shard"}}) {
    if (degree > 1) {
      shape.push_back(degree);
      names.push_back(name);
    }
  }
  if (shape.empty()) {
    shape = {1};
    names = {"dp_replicate"};
  }
  // A dimension that spans the whole world is the default group itself, as in PyTorch's
  // one-dimensional meshes: no second communicator over the same ranks.
  const int world = distributed::get_world_size();
  return distributed::DeviceMesh(device_type, shape, names, distributed::get_rank(), world,
                                 [world](const std::vector<int>& ranks, const std::string& name) {
                                   return static_cast<int>(ranks.size()) == world
                                              ? distributed::default_group()
                                              : distributed::new_group(ranks, name);
                                 });
}

std::string ParallelDims::str() const {
  std::string s;
  auto add = [&s](int degree, const char* name) {
    if (degree > 1) s += (s.empty() ? "" : " x ") + std::string(name) + " " + std::to_string(degree);
  };
  add(pp, "pp");
  add(dp_replicate, "dp_replicate");
  add(dp_shard, "dp_shard");
  add(dp_devices, "dp_devices");
  add(mp_stages, "mp_stages");
  return (s.empty() ? std::string("one device") : s) + " (world " + std::to_string(world_size) + ")";
}

}  // namespace loom::examples
