#include "parallel/tensor/redistribute.h"

#include <optional>
#include <vector>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: cat
#include "core/error.h"          // defines: LOOM_CHECK
#include "core/factory.h"        // defines: zeros
#include "core/trace.h"          // defines: trace::Span (LOOM_TRACE)

namespace loom::distributed {
namespace {

TensorOptions options_of(const Tensor& t) { return TensorOptions(t.dtype()).device(t.device()); }

size_t at(int64_t dim) { return static_cast<size_t>(dim); }

// `piece` written into the first rows of a zero tensor `capacity` rows long along `dim`:
// the equal-sized block a collective moves. See Note [Uneven shards].
Tensor padded(const Tensor& piece, int64_t dim, int64_t capacity) {
  Shape shape = piece.shape();
  shape[at(dim)] = capacity;
  Tensor block = zeros(shape, options_of(piece));
  if (piece.size(dim) > 0) block.narrow(dim, 0, piece.size(dim)).copy_(piece);
  return block;
}

// Rows [range.offset, + range.length) of `t` along `dim`, as a tensor of its own.
Tensor rows(const Tensor& t, int64_t dim, ShardRange range) {
  if (range.length == 0) {
    Shape shape = t.shape();
    shape[at(dim)] = 0;
    return zeros(shape, options_of(t));
  }
  return t.narrow(dim, range.offset, range.length).clone();
}

// Shard(dim) -> Replicate(): every rank's padded shard gathered, cut back and joined.
Tensor all_gather_shards(const Tensor& local, Communicator& group, const Shape& global_shape, int64_t dim) {
  const int64_t size = global_shape[at(dim)];
  const int64_t capacity = shard_capacity(size, group.size());
  if (capacity == 0) return zeros(global_shape, options_of(local));
  std::vector<Tensor> gathered;
  group.all_gather(gathered, padded(local, dim, capacity))->wait();
  std::vector<Tensor> pieces;
  for (int r = 0; r < group.size(); ++r) {
    const ShardRange range = shard_range(size, group.size(), r);
    if (range.length > 0) pieces.push_back(gathered[static_cast<size_t>(r)].narrow(dim, 0, range.length));
  }
  return cat(pieces, dim);
}

// Partial() -> Shard(dim): rank r's chunk of every rank's summand, summed on rank r.
Tensor reduce_scatter_shards(const Tensor& local, Communicator& group, int64_t dim) {
  const int64_t size = local.size(dim);
  const int64_t capacity = shard_capacity(size, group.size());
  const ShardRange mine = shard_range(size, group.size(), group.rank());
  if (capacity == 0) return rows(local, dim, mine);
  std::vector<Tensor> blocks;
  for (int r = 0; r < group.size(); ++r)
    blocks.push_back(padded(rows(local, dim, shard_range(size, group.size(), r)), dim, capacity));
  Tensor out = zeros(blocks[0].shape(), options_of(local));
  group.reduce_scatter(out, blocks)->wait();
  return rows(out, dim, {0, mine.length});
}

}  // namespace

Tensor redistribute_local(const Tensor& local, Communicator& group, const Shape& global_shape, const Placement& from_,
                          const Placement& to_) {
  const auto ndim = static_cast<int64_t>(global_shape.size());
  const Placement from = normalized(from_, ndim), to = normalized(to_, ndim);
  const Shape expected = local_shape(global_shape, from, group.size(), group.rank());
  LOOM_CHECK(local.shape() == expected, "redistribute ", from.str(), " -> ", to.str(), ": rank ", group.rank(), " of ",
             group.size(), " expected a local tensor of shape ", expected, " (global shape ", global_shape,
             "), got ", local.shape());
  if (from == to) return local;

  NoGradGuard no_grad;
  const Tensor x = local.detach().contiguous();
  // A span per move on the group's communication row (docs/tensor_parallel.md's trace):
  // the collectives run on the calling thread, so this is their time.
  std::optional<trace::Span> span;
  if (trace::enabled())
    span.emplace(detail::str(from.is_partial() ? (to.is_replicate() ? "all_reduce " : "reduce_scatter ")
                                               : (from.is_shard() ? "all_gather " : "chunk "),
                             global_shape),
                 "dtensor", trace::track(detail::str("comm (rank ", group.rank(), ", dtensor)")));
  if (from.is_shard() && to.is_replicate()) return all_gather_shards(x, group, global_shape, from.dim);
  if (from.is_partial() && to.is_replicate()) {
    Tensor sum = x.clone();
    group.all_reduce(sum)->wait();
    return sum;
  }
  if (from.is_partial() && to.is_shard()) return reduce_scatter_shards(x, group, to.dim);
  if (from.is_replicate() && to.is_shard())
    return rows(x, to.dim, shard_range(global_shape[at(to.dim)], group.size(), group.rank()));
  LOOM_FAIL("redistribute ", from.str(), " -> ", to.str(), " is not supported; the supported moves are "
            "Shard(d) -> Replicate() (all_gather), Partial() -> Replicate() (all_reduce), Partial() -> Shard(d) "
            "(reduce_scatter) and Replicate() -> Shard(d) (local chunk); go through Replicate() for the others");
}

}  // namespace loom::distributed
