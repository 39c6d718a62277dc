#include "parallel/checkpoint/sharded_state.h"

#include <sstream>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "core/error.h"

namespace loom::distributed::checkpoint {
namespace {

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

LocalTensor one_piece(const std::string& name, const Tensor& local, const Shape& global_shape, const Chunk& chunk,
                      bool write) {
  LOOM_CHECK(local.defined(), "sharded state: ", name, " has no local tensor");
  LOOM_CHECK(local.is_contiguous(), "sharded state: ", name, "'s local tensor (shape ", local.shape(),
             ") is not contiguous; pass a contiguous one (its pieces are read as row-major ranges)");
  check_within(chunk, global_shape, "sharded state: " + name);
  LOOM_CHECK(local.numel() >= chunk.numel(), "sharded state: ", name, "'s local tensor has ", local.numel(),
             " elements, fewer than its piece ", chunk.str(), " of ", global_shape, " (", chunk.numel(), ")");
  return LocalTensor{local, {Piece{name, global_shape, chunk, 0}}, write};
}

}  // namespace

LocalTensor whole(const std::string& name, const Tensor& tensor, bool write) {
  return one_piece(name, tensor, tensor.shape(), whole_chunk(tensor.shape()), write);
}

Chunk cut(const Chunk& chunk, const Placement& placement, int world, int rank) {
  LOOM_CHECK(!placement.is_partial(), "a checkpoint cannot hold a Partial() tensor's summands as its pieces; "
             "redistribute it to Replicate() or Shard(d) first");
  if (placement.is_replicate()) return chunk;
  const Placement p = normalized(placement, static_cast<int64_t>(chunk.sizes.size()));
  const size_t d = static_cast<size_t>(p.dim);
  const ShardRange range = shard_range(chunk.sizes[d], world, rank);
  Chunk out = chunk;
  out.offsets[d] += range.offset;
  out.sizes[d] = range.length;
  return out;
}

LocalTensor sharded(const std::string& name, const Tensor& local, const Shape& global_shape,
                    const Placement& placement, int world, int rank) {
  const bool write = !placement.is_replicate() || rank == 0;
  return one_piece(name, local, global_shape, cut(whole_chunk(global_shape), placement, world, rank), write);
}

LocalTensor sharded_2d(const std::string& name, const Tensor& local, const Shape& global_shape,
                       const Placement& first, int first_world, int first_rank,
                       const Placement& second, int second_world, int second_rank) {
  const Chunk chunk =
      cut(cut(whole_chunk(global_shape), first, first_world, first_rank), second, second_world, second_rank);
  const bool write = (!first.is_replicate() || first_rank == 0) && (!second.is_replicate() || second_rank == 0);
  return one_piece(name, local, global_shape, chunk, write);
}

std::string piece_key(const Piece& piece) { return piece.name + "@" + join(piece.chunk.offsets); }

Tensor piece_view(const LocalTensor& local, const Piece& piece) {
  const int64_t n = piece.chunk.numel();
  LOOM_CHECK(piece.local_offset >= 0 && piece.local_offset + n <= local.tensor.numel(), "sharded state: piece ",
             piece.name, " ", piece.chunk.str(), " needs elements [", piece.local_offset, ", ",
             piece.local_offset + n, ") of a local tensor of ", local.tensor.numel());
  return local.tensor.reshape({local.tensor.numel()}).narrow(0, piece.local_offset, n).view(piece.chunk.sizes);
}

safetensors::File pack(const ShardedState& state, const safetensors::Metadata& metadata) {
  NoGradGuard no_grad;
  safetensors::File file;
  for (const LocalTensor& local : state) {
    if (!local.write) continue;
    for (const Piece& piece : local.pieces) {
      if (piece.chunk.numel() == 0) continue;  // a rank past the end of an uneven cut holds nothing
      const std::string key = piece_key(piece);
      LOOM_CHECK(!file.tensors.contains(key), "sharded state: the piece ", key, " of ", piece.name,
                 " is held twice by this rank");
      file.tensors.insert(key, piece_view(local, piece).detach().clone());
      file.metadata.insert("dcp." + key, "global=" + join(piece.global_shape) + ";offsets=" + join(piece.chunk.offsets));
    }
  }
  for (const auto& [key, value] : metadata) file.metadata.insert(key, value);
  return file;
}

}  // namespace loom::distributed::checkpoint
