#include "parallel/parallel_dims.h"

#include "core/error.h"                   // defines: LOOM_CHECK
#include "parallel/comm/process_group.h"  // defines: get_rank, get_world_size, default_group, new_group

namespace loom::distributed {

namespace {

// "pp 2 x dp_replicate 1 x dp_shard 3 x tp 2", every factor, for the errors.
std::string factors(const ParallelDims& d) {
  return detail::str("pp ", d.pp, " x dp_replicate ", d.dp_replicate, " x dp_shard ", d.dp_shard, " x tp ", d.tp);
}

}  // namespace

ParallelDims ParallelDims::make(const ParallelDims& degrees, int world_size) {
  ParallelDims d = degrees;
  d.world_size = world_size;
  LOOM_CHECK(world_size >= 1, "ParallelDims: expected a world size of at least 1, got ", world_size);
  for (auto [degree, name] : {std::pair{d.pp, "pp"}, {d.dp_replicate, "dp_replicate"}, {d.tp, "tp"}})
    LOOM_CHECK(degree >= 1, "ParallelDims: the ", name, " degree must be at least 1, got ", degree, " (", factors(d),
               ", world ", world_size, ")");
  LOOM_CHECK(d.dp_shard >= 1 || d.dp_shard == -1, "ParallelDims: the dp_shard degree must be at least 1, or -1 for "
             "whatever the world leaves, got ", d.dp_shard, " (", factors(d), ", world ", world_size, ")");
  if (d.dp_shard == -1) {
    const int others = d.pp * d.dp_replicate * d.tp;
    LOOM_CHECK(world_size % others == 0, "ParallelDims: dp_shard -1 takes what the world leaves, but the world of ",
               world_size, " is not a multiple of pp ", d.pp, " x dp_replicate ", d.dp_replicate, " x tp ", d.tp, " = ",
               others, "; start a multiple of ", others, " processes, or give the degrees so that they multiply to ",
               world_size);
    d.dp_shard = world_size / others;
  }
  LOOM_CHECK(d.dp_devices >= 1 && d.mp_stages >= 1, "ParallelDims: dp_devices and mp_stages must be at least 1, got ",
             d.dp_devices, " and ", d.mp_stages);
  LOOM_CHECK((d.dp_devices == 1 && d.mp_stages == 1) || world_size == 1, "ParallelDims: dp_devices ", d.dp_devices,
             " and mp_stages ", d.mp_stages, " run in one process over several devices, but WORLD_SIZE is ",
             world_size, "; across processes use the degrees (pp, dp_replicate, dp_shard, tp)");
  const int64_t product = int64_t(d.pp) * d.dp_replicate * d.dp_shard * d.tp;
  LOOM_CHECK(product == world_size, "ParallelDims: the parallel degrees multiply to ", product, " (", factors(d),
             ") but WORLD_SIZE is ", world_size, "; start ", product, " processes (loomrun --nproc_per_node ",
             product, ") or change a degree (-1 infers dp_shard)");
  return d;
}

ParallelDims::Coordinates ParallelDims::coordinates(int world_rank) const {
  LOOM_CHECK(world_rank >= 0 && world_rank < world_size, "ParallelDims: rank ", world_rank, " is outside the world of ",
             world_size);
  // See Note [The mesh's order: pp, dp_replicate, dp_shard, tp]: row-major, tp fastest.
  Coordinates at;
  int rest = world_rank;
  at.tp = rest % tp;
  rest /= tp;
  at.dp_shard = rest % dp_shard;
  rest /= dp_shard;
  at.dp_replicate = rest % dp_replicate;
  at.pp = rest / dp_replicate;
  at.batch = at.dp_replicate * dp_shard + at.dp_shard;
  return at;
}

std::vector<std::string> ParallelDims::mesh_dim_names() const {
  std::vector<std::string> names;
  for (auto [degree, name] : {std::pair{pp, "pp"}, {dp_replicate, "dp_replicate"}, {dp_shard, "dp_shard"}, {tp, "tp"}})
    if (degree > 1) names.push_back(name);
  return names;
}

std::vector<int> ParallelDims::mesh_shape() const {
  std::vector<int> shape;
  for (int degree : {pp, dp_replicate, dp_shard, tp})
    if (degree > 1) shape.push_back(degree);
  return shape;
}

DeviceMesh ParallelDims::build_mesh(const std::string& device_type, int rank,
                                    const DeviceMesh::GroupMaker& make_group) const {
  std::vector<int> shape = mesh_shape();
  std::vector<std::string> names = mesh_dim_names();
  if (shape.empty()) {  // one process, or nothing parallel across processes
    shape = {1};
    names = {"dp_replicate"};
  }
  DeviceMesh mesh(device_type, shape, names, rank, world_size, make_group);
  std::vector<std::string> batch;
  if (dp_replicate_enabled()) batch.push_back("dp_replicate");
  if (dp_shard_enabled()) batch.push_back("dp_shard");
  if (!batch.empty()) {
    mesh.flatten(batch, "batch");
    mesh.flatten(batch, "loss");
  }
  return mesh;
}

DeviceMesh ParallelDims::build_mesh(const std::string& device_type, World& world) const {
  return build_mesh(device_type, world.rank, [&world](const std::vector<int>& ranks, const std::string& name) {
    return new_group(world, ranks, name);
  });
}

DeviceMesh ParallelDims::build_mesh(const std::string& device_type) const {
  const int world = get_world_size();
  LOOM_CHECK(world == world_size, "ParallelDims: built for a world of ", world_size, " but the process group has ",
             world);
  return build_mesh(device_type, get_rank(), [world](const std::vector<int>& ranks, const std::string& name) {
    return static_cast<int>(ranks.size()) == world ? default_group() : new_group(ranks, name);
  });
}

std::string ParallelDims::str() const {
  std::string in_process;
  if (dp_devices_enabled()) in_process += detail::str(" dp_devices=", dp_devices);
  if (mp_enabled()) in_process += detail::str(" mp_stages=", mp_stages);
  return detail::str("pp=", pp, " dp_replicate=", dp_replicate, " dp_shard=", dp_shard, " tp=", tp, in_process,
                     " (world ", world_size, ")");
}

std::string ParallelDims::draw() const {
  // Ranks found by searching coordinates(): the picture is drawn from the one layout.
  std::vector<int> rank_at(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const Coordinates at = coordinates(r);
    rank_at[size_t((at.pp * batch_size() + at.batch) * tp + at.tp)] = r;
  }
  std::string out = str() + "\n";
  const std::string label_blank(40, ' ');
  for (int p = 0; p < pp; ++p) {
    std::string header = detail::str("pp ", p);
    header.resize(label_blank.size(), ' ');
    for (int t = 0; t < tp; ++t) header += detail::str("tp ", t, t < 10 ? "     " : "    ");
    out += header.substr(0, header.find_last_not_of(' ') + 1) + "\n";
    for (int b = 0; b < batch_size(); ++b) {
      std::string row = detail::str("  batch ", b, " (dp_replicate ", b / dp_shard, ", dp_shard ", b % dp_shard, ")");
      row.resize(label_blank.size(), ' ');
      for (int t = 0; t < tp; ++t) {
        std::string cell = detail::str("rank ", rank_at[size_t((p * batch_size() + b) * tp + t)]);
        cell.resize(9, ' ');
        row += cell;
      }
      out += row.substr(0, row.find_last_not_of(' ') + 1) + "\n";
    }
  }
  return out;
}

}  // namespace loom::distributed
