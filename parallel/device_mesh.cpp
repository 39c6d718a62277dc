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
    : device_type_(std::move(device_type)), shape_(std::move(shape)), dim_names_(std::move(dim_names)), rank_(rank) {
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

std::vector<int> DeviceMesh::group_ranks(const std::string& dim) const {
  const size_t d = index(dim);
  const int stride = strides_of(shape_)[d];
  const int base = rank_ - coordinate_[d] * stride;
  std::vector<int> ranks;
  for (int k = 0; k < shape_[d]; ++k) ranks.push_back(base + k * stride);
  return ranks;
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
