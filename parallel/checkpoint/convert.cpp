#include "parallel/checkpoint/convert.h"

#include "core/error.h"
#include "core/factory.h"                     // defines: empty
#include "parallel/distributed_checkpoint.h"  // defines: write_shard, write_manifest

namespace loom::distributed::checkpoint {

OrderedDict<Tensor> consolidate(const CheckpointIndex& index, bool with_optimizer) {
  ShardedState wanted;
  for (const auto& [name, saved] : index.pieces) {
    if (!with_optimizer && name.rfind("optim.", 0) == 0) continue;
    const SavedPiece& first = saved.front();
    const DType dtype = index.files.at(first.file).tensors.find(first.key)->dtype();
    wanted.push_back(whole(name, empty(first.global_shape, TensorOptions(dtype))));
  }
  load(index, wanted);  // refuses a set that does not cover a tensor (Note [Planning a load])
  OrderedDict<Tensor> out;
  for (const LocalTensor& t : wanted) out.insert(t.pieces.front().name, t.tensor);
  return out;
}

void write_one_rank_set(const OrderedDict<Tensor>& tensors, const std::string& step_dir,
                        const safetensors::Metadata& metadata) {
  ShardedState state;
  for (const auto& [name, t] : tensors) {
    LOOM_CHECK(name.find('@') == std::string::npos, "write_one_rank_set: tensor name '", name,
               "' holds '@', which sharded sets use to name a piece's offsets (Note [Saved pieces])");
    state.push_back(whole(name, t.contiguous()));
  }
  safetensors::File file = pack(state, metadata);
  remove_manifest(step_dir);
  write_shard(step_dir, 0, 1, file.tensors, file.metadata);
  write_manifest(step_dir, 1);
}

}  // namespace loom::distributed::checkpoint
