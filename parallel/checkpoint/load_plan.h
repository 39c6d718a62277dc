// Reading a sharded checkpoint back under any layout: the index of every saved piece, the
// plan of which saved boxes fill which wanted ones, and its execution. PyTorch's
// torch.distributed.checkpoint: the Metadata (index), the LoadPlan of ReadItems, and
// the storage reader that carries it out.
//
//   CheckpointIndex index = read_checkpoint_index(step_dir);   // every shard file of the set
//   ShardedState wanted = ...;                                  // this rank's boxes, this layout
//   LoadPlan plan = plan_load(index, wanted);                   // refuses gaps and shape changes
//   execute(plan, index, wanted);                               // copies each overlap in place
//
// Note [Planning a load]
// For every piece this rank wants (a box of a named logical tensor: sharded_state.h), the
// plan lists the saved pieces of the same name whose boxes overlap it, and for each overlap
// where it lies in the saved piece and in the wanted one (both relative to their own
// corner: the saved piece is a tensor of its box's sizes, the wanted one a view into a
// local tensor). The plan is checked before a byte moves: the global shapes agree (a
// ResNet's checkpoint will not fill a wider ResNet), and the overlaps' volumes add up to
// the wanted piece's (saved pieces do not overlap one another, so equality means every
// element is covered exactly once: a checkpoint missing a rank's file, or saved by a
// layout that wrote a replica nowhere, is refused with the elements nobody saved).
// loom reads whole shard files (the manifest checksums them anyway, Note [The manifest
// is written last]); DCP reads byte ranges. The plan is the same either way.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nn/safetensors.h"                    // defines: safetensors::File
#include "parallel/checkpoint/sharded_state.h" // defines: ShardedState, Piece, Chunk

namespace loom::distributed::checkpoint {

// One saved piece: which file holds it, under which tensor name, and its box.
struct SavedPiece {
  size_t file = 0;
  std::string key;
  Shape global_shape;
  Chunk chunk;
};

struct CheckpointIndex {
  std::string source;                    // the step directory (for messages)
  std::vector<std::string> file_names;   // relative to it, in the manifest's order
  std::vector<safetensors::File> files;  // their contents
  std::map<std::string, std::vector<SavedPiece>> pieces;  // logical tensor name -> its saved pieces

  bool holds(const std::string& name) const { return pieces.count(name) != 0; }
  // The saved global shape of `name` (a loom::Error when it is not in the checkpoint).
  const Shape& global_shape(const std::string& name) const;
};

// The index of a complete step directory (parallel/distributed_checkpoint.h): its manifest's
// files, each read whole. A loom::Error when the set is incomplete.
CheckpointIndex read_checkpoint_index(const std::string& step_dir);
// The same from files already in memory (tests; a converter). Identical boxes saved by
// several files are kept once (the first); overlapping unequal ones are a loom::Error.
CheckpointIndex index_files(std::vector<safetensors::File> files, std::vector<std::string> file_names,
                            const std::string& source);

struct ReadItem {
  size_t target = 0;       // index into the wanted ShardedState
  size_t target_piece = 0; // and into its pieces
  size_t file = 0;         // which saved file
  std::string key;         // the saved piece's tensor in it
  Chunk saved_box;         // the overlap, relative to the saved piece's corner
  Chunk wanted_box;        // the same elements, relative to the wanted piece's corner
};

struct LoadPlan {
  std::vector<ReadItem> items;
  // One line per item: "fc.weight [0:5, 0:3] <- shard-1-of-2.safetensors fc.weight@5,0 [0:5, 0:3]".
  std::string str(const CheckpointIndex& index, const ShardedState& wanted) const;
  // Which saved files the plan reads from.
  std::vector<size_t> files_read() const;
};

// See Note [Planning a load]. A loom::Error naming the tensor when one is missing from the
// checkpoint, has another global shape there, or has elements no saved piece covers.
LoadPlan plan_load(const CheckpointIndex& index, const ShardedState& wanted);

// Copies every item of `plan` into `wanted`'s local tensors (checked: same dtype). Not
// collective; differentiable history is not recorded (as load_state_dict).
void execute(const LoadPlan& plan, const CheckpointIndex& index, ShardedState& wanted);

// plan_load then execute.
void load(const CheckpointIndex& index, ShardedState& wanted);

}  // namespace loom::distributed::checkpoint
