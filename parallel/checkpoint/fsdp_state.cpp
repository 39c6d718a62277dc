#include "parallel/checkpoint/fsdp_state.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/fsdp/flat_param.h"   // defines: FlatParameter
#include "parallel/fsdp/runtime.h"      // defines: Unit

namespace loom::distributed::checkpoint {
namespace {

// `chunk` of a TP-local tensor, moved into the whole parameter's coordinates.
Piece translated(const std::string& name, const Shape& local_shape, const Chunk& chunk, int64_t local_offset,
                 const GlobalOf& global_of) {
  auto [global_shape, box] = global_of(name, local_shape);
  LOOM_CHECK(box.sizes == local_shape, "fsdp checkpoint: ", name, "'s local tensor has shape ", local_shape,
             " but its box in the global ", global_shape, " is ", box.str());
  Piece piece{name, global_shape, chunk, local_offset};
  for (size_t d = 0; d < chunk.offsets.size(); ++d) piece.chunk.offsets[d] += box.offsets[d];
  return piece;
}

}  // namespace

std::pair<Shape, Chunk> untranslated(const std::string&, const Shape& local_shape) {
  return {local_shape, whole_chunk(local_shape)};
}

ParamPieces fsdp_param_pieces(const fsdp::FullyShardedDataParallel& fsdp,
                              const std::function<std::string(const Tensor&)>& name_of, const GlobalOf& global_of,
                              bool write) {
  const auto& group = fsdp.shard_group();
  const int world = group ? group->size() : 1, rank = group ? group->rank() : 0;
  ParamPieces out;
  for (const fsdp::Unit& unit : fsdp.units()) {
    if (!unit.flat) continue;
    const fsdp::FlatParameter& flat = *unit.flat;
    for (size_t i = 0; i < flat.params().size(); ++i) {
      const std::string name = name_of(flat.params()[i]);
      const Shape& shape = flat.shapes()[i];
      if (flat.per_parameter()) {  // FSDP2: this rank's rows of the parameter, a tensor of their own
        const Tensor& local = flat.local_shards()[i];
        LocalTensor& entry = out[local.unsafe_impl()] = LocalTensor{local, {}, write};
        const ShardRange rows = shard_range(shape.empty() ? 1 : shape[0], world, rank);
        if (rows.length == 0) continue;
        Chunk chunk = whole_chunk(shape);
        if (!shape.empty()) {
          chunk.offsets[0] = rows.offset;
          chunk.sizes[0] = rows.length;
        }
        entry.pieces.push_back(translated(name, shape, chunk, 0, global_of));
        continue;
      }
      // FSDP1: this rank's slice [rank * S, (rank + 1) * S) of the padded flat buffer.
      const Tensor& shard = flat.shard();
      LocalTensor& entry = out[shard.unsafe_impl()];
      entry.tensor = shard;
      entry.write = write;
      const int64_t size = flat.layout().shard_size, begin = rank * size, end = begin + size;
      const int64_t offset = flat.layout().offsets[i], n = loom::numel(shape);
      const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + n);
      int64_t at = lo - begin;
      if (hi > lo) {
        for (const Chunk& chunk : chunks_of_flat_range(shape, lo - offset, hi - offset)) {
          entry.pieces.push_back(translated(name, shape, chunk, at, global_of));
          at += chunk.numel();
        }
      }
    }
  }
  return out;
}

}  // namespace loom::distributed::checkpoint
