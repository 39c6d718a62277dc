#include "parallel/fsdp/per_parameter_layout.h"

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "core/error.h"
#include "core/kernels.h"      // defines: copy_kernel

namespace loom::fsdp {

using distributed::ShardRange;

PerParameterLayout per_parameter_layout(const std::vector<Shape>& shapes, int group_size) {
  LOOM_CHECK(group_size >= 1, "per_parameter_layout: the group size must be at least 1, got ", group_size);
  PerParameterLayout layout;
  layout.group_size = group_size;
  for (const Shape& shape : shapes) {
    ParameterPiece piece;
    piece.rows = shape.empty() ? 1 : shape[0];
    piece.row_numel = shape.empty() ? 1 : numel(Shape(shape.begin() + 1, shape.end()));
    piece.chunk_rows = distributed::shard_capacity(piece.rows, group_size);
    piece.offset = layout.shard_size;
    piece.full_offset = layout.total;
    layout.shard_size += piece.numel();
    layout.total += numel(shape);
    layout.pieces.push_back(piece);
  }
  return layout;
}

ShardRange PerParameterLayout::rows_of(size_t i, int rank) const {
  return distributed::shard_range(pieces.at(i).rows, group_size, rank);
}

Shape PerParameterLayout::local_shape(size_t i, const Shape& shape, int rank) const {
  Shape local = shape.empty() ? Shape{1} : shape;
  local[0] = rows_of(i, rank).length;
  return local;
}

void pack_shard(const PerParameterLayout& layout, const Tensor& full, int rank, const Tensor& shard) {
  LOOM_CHECK(full.dim() == 1 && full.numel() >= layout.total, "pack_shard: expected the unsharded buffer, at least ",
             layout.total, " values, got ", full.str());
  LOOM_CHECK(shard.dim() == 1 && shard.numel() == layout.shard_size, "pack_shard: expected a shard of ",
             layout.shard_size, " values, got ", shard.str());
  NoGradGuard no_grad;
  for (size_t i = 0; i < layout.pieces.size(); ++i) {
    const ParameterPiece& piece = layout.pieces[i];
    const ShardRange rows = layout.rows_of(i, rank);
    const int64_t values = rows.length * piece.row_numel;
    if (values > 0)
      shard.narrow(0, piece.offset, values).copy_(full.narrow(0, piece.full_offset + rows.offset * piece.row_numel, values));
    if (values < piece.numel()) shard.narrow(0, piece.offset + values, piece.numel() - values).zero_();
  }
}

void unpack_shards(const PerParameterLayout& layout, const Tensor& gathered, const Tensor& full) {
  LOOM_CHECK(gathered.dim() == 1 && gathered.numel() == layout.group_size * layout.shard_size, "unpack_shards: "
             "expected every rank's shard, ", layout.group_size, " x ", layout.shard_size, " values, got ",
             gathered.str());
  LOOM_CHECK(full.dim() == 1 && full.numel() >= layout.total, "unpack_shards: expected the unsharded buffer, at "
             "least ", layout.total, " values, got ", full.str());
  // The copy goes straight to the kernel, as all_gather writes: Tensor::copy_ would bump
  // the version of `full`'s storage, and a unit gathered again for its backward writes under
  // the tensors autograd saved from its forward (Note [Releasing a gathered unit],
  // flat_param.cpp), which would then count as modified in place.
  NoGradGuard no_grad;
  const auto copy = copy_kernel(full.device());
  for (size_t i = 0; i < layout.pieces.size(); ++i) {
    const ParameterPiece& piece = layout.pieces[i];
    for (int r = 0; r < layout.group_size; ++r) {
      const ShardRange rows = layout.rows_of(i, r);
      const int64_t values = rows.length * piece.row_numel;
      if (values == 0) continue;
      Tensor target = full.narrow(0, piece.full_offset + rows.offset * piece.row_numel, values);
      copy(gathered.narrow(0, layout.slot(i, r), values), target, /*non_blocking=*/false);
    }
  }
}

}  // namespace loom::fsdp
