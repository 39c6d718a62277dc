#include "parallel/tensor/placement.h"

#include <algorithm>

#include "core/error.h"  // defines: LOOM_CHECK

namespace loom::distributed {

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard: return "Shard(dim=" + std::to_string(dim) + ")";
    case Kind::Replicate: return "Replicate()";
    case Kind::Partial: return "Partial(sum)";
  }
  return "?";
}

int64_t shard_capacity(int64_t size, int world) {
  LOOM_CHECK(world >= 1, "shard_capacity: expected a group of at least 1 rank, got ", world);
  LOOM_CHECK(size >= 0, "shard_capacity: expected a dimension size >= 0, got ", size);
  return (size + world - 1) / world;
}

ShardRange shard_range(int64_t size, int world, int rank) {
  LOOM_CHECK(rank >= 0 && rank < world, "shard_range: rank ", rank, " is not in a group of ", world);
  const int64_t capacity = shard_capacity(size, world);
  const int64_t begin = std::min(size, capacity * rank);
  const int64_t end = std::min(size, capacity * (rank + 1));
  return {begin, end - begin};
}

Placement normalized(const Placement& placement, int64_t ndim) {
  if (!placement.is_shard()) return placement;
  const int64_t dim = placement.dim < 0 ? placement.dim + ndim : placement.dim;
  LOOM_CHECK(dim >= 0 && dim < ndim, "Shard(dim=", placement.dim, ") does not fit a tensor of ", ndim,
             " dimensions: expected a dim in [", -ndim, ", ", ndim - 1, "]");
  return Shard(dim);
}

Shape local_shape(const Shape& global_shape, const Placement& placement, int world, int rank) {
  const Placement p = normalized(placement, static_cast<int64_t>(global_shape.size()));
  if (!p.is_shard()) return global_shape;
  Shape shape = global_shape;
  shape[static_cast<size_t>(p.dim)] = shard_range(global_shape[static_cast<size_t>(p.dim)], world, rank).length;
  return shape;
}

}  // namespace loom::distributed
