#include "parallel/device_mesh.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"                   // defines: LOOM_CHECK
#include "parallel/comm/process_group.h"  // defines: get_rank, get_world_size, new_group (default group)

namespace loom::distributed {

namespace {

// Row-major strides: the last dimension varies fastest.
std::vector<int> strides_of(const std::vector<int>& shape) {
  std::vector<int> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

}  // namespace

DeviceMesh::DeviceMesh(std::string device_type, std::vector<int> shape, std::vector<std::string> dim_names,
                       World& world)
    : DeviceMesh(std::move(device_type), std::move(shape), std::move(dim_names), world.rank, world.size,
                 [&world](const std::vector<int>& ranks, const std::string& name) {
                   return new_group(world, ranks, name);
                 }) {}

DeviceMesh::DeviceMesh(std::string device_type, std::vector<int> shape, std::vector<std::string> dim_names, int rank,
                       int world_size, const GroupMaker& make_group)
    : device_type_(std::move(device_type)),
      shape_(std::move(shape)),
      dim_names_(std::move(dim_names)),
      rank_(rank),
      make_group_(make_group) {
  LOOM_CHECK(device_type_ == "cpu" || device_type_ == "cuda", "DeviceMesh: expected device_type \"cpu\" or \"cuda\", "
             "got \"", device_type_, "\"");
  LOOM_CHECK(!shape_.empty(), "DeviceMesh: expected a mesh shape with at least one dimension, got []");
  int64_t product = 1;
  for (int n : shape_) {
    LOOM_CHECK(n >= 1, "DeviceMesh: every dimension of the mesh shape must be at least 1, got ", format_ranks(shape_));
    product *= n;
  }
  LOOM_CHECK(product == world_size, "DeviceMesh: the mesh shape ", format_ranks(shape_), " holds ", product,
             " ranks but the world has ", world_size, " (WORLD_SIZE); the product of the mesh's dimensions must equal "
             "the number of processes");
  if (dim_names_.empty())
    for (size_t d = 0; d < shape_.size(); ++d) dim_names_.push_back(std::to_string(d));
  LOOM_CHECK(dim_names_.size() == shape_.size(), "DeviceMesh: ", dim_names_.size(), " dimension names for a mesh of ",
             shape_.size(), " dimensions ", format_ranks(shape_), "; give one name per dimension");
  for (size_t d = 0; d < dim_names_.size(); ++d) {
    LOOM_CHECK(!dim_names_[d].empty(), "DeviceMesh: dimension ", d, "'s name is empty");
    LOOM_CHECK(std::count(dim_names_.begin(), dim_names_.end(), dim_names_[d]) == 1, "DeviceMesh: the dimension name '",
               dim_names_[d], "' is used twice; names must be unique");
  }
  LOOM_CHECK(rank >= 0 && rank < world_size, "DeviceMesh: expected a rank in [0, ", world_size, "), got ", rank);

  const std::vector<int> strides = strides_of(shape_);
  for (size_t d = 0; d < shape_.size(); ++d) coordinate_.push_back(rank / strides[d] % shape_[d]);
  // Along each dim, one group per position of the other dims, in order of the smallest
  // rank of each group (whose coordinate along d is 0): the same order on every rank.
  for (size_t d = 0; d < shape_.size(); ++d) {
    std::shared_ptr<Communicator> mine;
    for (int base = 0; base < world_size; ++base) {
      if (base / strides[d] % shape_[d] != 0) continue;
      std::vector<int> ranks;
      for (int k = 0; k < shape_[d]; ++k) ranks.push_back(base + k * strides[d]);
      auto group = make_group(ranks, dim_names_[d]);
      if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) mine = std::move(group);
    }
    groups_.push_back(std::move(mine));
  }
}

int DeviceMesh::size() const {
  int n = 1;
  for (int s : shape_) n *= s;
  return n;
}

// The world ranks that share every coordinate with `rank` but those along `dims`, in
// row-major order over `dims` (so a rank's position in the list is its group rank).
static std::vector<int> ranks_along(const std::vector<int>& shape, const std::vector<size_t>& dims, int rank) {
  const std::vector<int> strides = strides_of(shape);
  int base = rank;
  for (size_t d : dims) base -= rank / strides[d] % shape[d] * strides[d];
  std::vector<int> ranks = {base};
  for (size_t d : dims) {  // outermost first: each later dim varies faster
    std::vector<int> next;
    for (int r : ranks)
      for (int k = 0; k < shape[d]; ++k) next.push_back(r + k * strides[d]);
    ranks = std::move(next);
  }
  return ranks;
}

std::vector<int> DeviceMesh::group_ranks(const std::string& dim) const {
  if (const Flattened* f = flattened(dim)) return ranks_along(shape_, f->dims, rank_);
  return ranks_along(shape_, {index(dim)}, rank_);
}

int DeviceMesh::size(const std::string& dim) const {
  if (const Flattened* f = flattened(dim)) {
    int n = 1;
    for (size_t d : f->dims) n *= shape_[d];
    return n;
  }
  return shape_[index(dim)];
}

int DeviceMesh::local_rank(const std::string& dim) const {
  if (const Flattened* f = flattened(dim)) {
    int r = 0;
    for (size_t d : f->dims) r = r * shape_[d] + coordinate_[d];
    return r;
  }
  return coordinate_[index(dim)];
}

const std::shared_ptr<Communicator>& DeviceMesh::group(const std::string& dim) const {
  if (const Flattened* f = flattened(dim)) return f->group;
  return groups_[index(dim)];
}

bool DeviceMesh::has(const std::string& dim) const {
  return flattened(dim) != nullptr || std::find(dim_names_.begin(), dim_names_.end(), dim) != dim_names_.end();
}

const DeviceMesh::Flattened* DeviceMesh::flattened(const std::string& name) const {
  for (const Flattened& f : flattened_)
    if (f.name == name) return &f;
  return nullptr;
}

void DeviceMesh::flatten(const std::vector<std::string>& dims, const std::string& name) {
  LOOM_CHECK(!dims.empty(), "DeviceMesh::flatten('", name, "'): expected at least one dimension to flatten");
  LOOM_CHECK(!name.empty() && !has(name), "DeviceMesh::flatten: the name '", name, "' is empty or already a ",
             "dimension or group of this mesh");
  Flattened f{name, {}, nullptr};
  for (const std::string& dim : dims) f.dims.push_back(index(dim));
  for (size_t i = 1; i < f.dims.size(); ++i)
    LOOM_CHECK(f.dims[i - 1] < f.dims[i], "DeviceMesh::flatten('", name, "'): the dimensions must be distinct and in "
               "the mesh's order (outermost first)");
  const auto same = std::find_if(flattened_.begin(), flattened_.end(), [&f](const Flattened& g) { return g.dims == f.dims; });
  if (f.dims.size() == 1) {
    f.group = groups_[f.dims[0]];
  } else if (same != flattened_.end()) {  // the same ranks under a second name: the same groups
    f.group = same->group;
  } else {
    // Every group, in order of its smallest rank (all of its coordinates along dims 0):
    // the same order on every rank, as the constructor's.
    const int world_size = size();
    for (int base = 0; base < world_size; ++base) {
      const std::vector<int> ranks = ranks_along(shape_, f.dims, base);
      if (ranks.front() != base) continue;
      auto group = make_group_(ranks, name);
      if (std::find(ranks.begin(), ranks.end(), rank_) != ranks.end()) f.group = std::move(group);
    }
  }
  flattened_.push_back(std::move(f));
}

size_t DeviceMesh::index(const std::string& dim) const {
  auto it = std::find(dim_names_.begin(), dim_names_.end(), dim);
  if (it == dim_names_.end()) {
    std::ostringstream names;
    for (size_t d = 0; d < dim_names_.size(); ++d) names << (d ? ", '" : "'") << dim_names_[d] << "'";
    LOOM_FAIL("DeviceMesh: no dimension named '", dim, "'; this mesh's dimensions are ", names.str());
  }
  return static_cast<size_t>(it - dim_names_.begin());
}

std::string DeviceMesh::str() const {
  // Nested brackets, one level per dim, over the ranks in row-major order.
  std::ostringstream out;
  const int total = size();
  const std::vector<int> strides = strides_of(shape_);
  for (int r = 0; r < total; ++r) {
    for (size_t d = 0; d < shape_.size(); ++d)
      if (r % (strides[d] * shape_[d]) == 0) out << "[";
    out << r;
    for (size_t d = shape_.size(); d-- > 0;)
      if ((r + 1) % (strides[d] * shape_[d]) == 0) out << "]";
    if (r + 1 < total) out << ", ";
  }
  std::ostringstream names;
  for (size_t d = 0; d < dim_names_.size(); ++d) names << (d ? ", '" : "'") << dim_names_[d] << "'";
  return "DeviceMesh('" + device_type_ + "', " + out.str() + ", mesh_dim_names=(" + names.str() +
         (dim_names_.size() == 1 ? ",))" : "))");
}

DeviceMesh init_device_mesh(const std::string& device_type, const std::vector<int>& mesh_shape,
                            const std::vector<std::string>& mesh_dim_names) {
  return DeviceMesh(device_type, mesh_shape, mesh_dim_names, get_rank(), get_world_size(),
                    [](const std::vector<int>& ranks, const std::string& name) { return new_group(ranks, name); });
}

}  // namespace loom::distributed
