#include "parallel/checkpoint/load_plan.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "autograd/grad_mode.h"                // defines: NoGradGuard
#include "core/error.h"
#include "parallel/distributed_checkpoint.h"   // defines: read_manifest, why_incomplete

namespace loom::distributed::checkpoint {
namespace {

std::vector<int64_t> parse_ints(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LOOM_CHECK(used == item.size() && !item.empty(), what, ": expected comma-separated integers, found '", text, "'");
    out.push_back(value);
  }
  return out;
}

// "global=4,3;offsets=2,0" -> (global shape, offsets).
std::pair<Shape, std::vector<int64_t>> parse_piece(const std::string& text, const std::string& what) {
  const size_t semicolon = text.find(';');
  LOOM_CHECK(text.rfind("global=", 0) == 0 && semicolon != std::string::npos &&
                 text.compare(semicolon + 1, 8, "offsets=") == 0,
             what, ": expected 'global=<shape>;offsets=<offsets>' (Note [Saved pieces]), found '", text, "'");
  return {parse_ints(text.substr(7, semicolon - 7), what), parse_ints(text.substr(semicolon + 9), what)};
}

Tensor narrowed(Tensor t, const Chunk& box) {
  for (size_t d = 0; d < box.sizes.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
  return t;
}

}  // namespace

const Shape& CheckpointIndex::global_shape(const std::string& name) const {
  auto found = pieces.find(name);
  LOOM_CHECK(found != pieces.end() && !found->second.empty(), source, " holds no tensor named ", name);
  return found->second.front().global_shape;
}

CheckpointIndex index_files(std::vector<safetensors::File> files, std::vector<std::string> file_names,
                            const std::string& source) {
  LOOM_CHECK(files.size() == file_names.size(), "index_files: ", files.size(), " files but ", file_names.size(),
             " names");
  CheckpointIndex index;
  index.source = source;
  index.file_names = std::move(file_names);
  index.files = std::move(files);
  for (size_t f = 0; f < index.files.size(); ++f) {
    for (const auto& [key, value] : index.files[f].metadata) {
      if (key.rfind("dcp.", 0) != 0) continue;
      const std::string tensor_key = key.substr(4);
      const std::string where = source + "/" + index.file_names[f] + " " + tensor_key;
      const Tensor* tensor = index.files[f].tensors.find(tensor_key);
      LOOM_CHECK(tensor != nullptr, where, ": the metadata describes a piece the file does not hold");
      auto [global_shape, offsets] = parse_piece(value, where);
      const std::string name = tensor_key.substr(0, tensor_key.rfind('@'));
      SavedPiece piece{f, tensor_key, global_shape, Chunk{offsets, tensor->shape()}};
      LOOM_CHECK(offsets.size() == global_shape.size(), where, ": offsets ", value, " do not match the global shape's ",
                 global_shape.size(), " dimensions");
      check_within(piece.chunk, global_shape, where);
      std::vector<SavedPiece>& saved = index.pieces[name];
      bool duplicate = false;
      for (const SavedPiece& other : saved) {
        LOOM_CHECK(other.global_shape == global_shape, where, " says ", name, " has global shape ", global_shape,
                   " but ", index.file_names[other.file], " says ", other.global_shape);
        if (other.chunk == piece.chunk) {  // a replica saved twice: keep the first (Note [Saved pieces])
          duplicate = true;
          break;
        }
        LOOM_CHECK(!intersect(other.chunk, piece.chunk), where, ": piece ", piece.chunk.str(), " of ", name,
                   " overlaps ", other.chunk.str(), " saved in ", index.file_names[other.file],
                   " without being equal to it: the layouts that wrote them disagree about the tensor");
      }
      if (!duplicate) saved.push_back(std::move(piece));
    }
  }
  return index;
}

CheckpointIndex read_checkpoint_index(const std::string& step_dir) {
  const std::string why = why_incomplete(step_dir);
  LOOM_CHECK(why.empty(), "sharded checkpoint ", step_dir, " is incomplete: ", why);
  const Manifest manifest = read_manifest(step_dir);
  std::vector<safetensors::File> files;
  std::vector<std::string> names;
  for (const ShardEntry& shard : manifest.shards) {
    files.push_back(safetensors::read_file(step_dir + "/" + shard.file));
    names.push_back(shard.file);
  }
  return index_files(std::move(files), std::move(names), step_dir);
}

LoadPlan plan_load(const CheckpointIndex& index, const ShardedState& wanted) {
  LoadPlan plan;
  for (size_t t = 0; t < wanted.size(); ++t) {
    for (size_t p = 0; p < wanted[t].pieces.size(); ++p) {
      const Piece& piece = wanted[t].pieces[p];
      auto found = index.pieces.find(piece.name);
      LOOM_CHECK(found != index.pieces.end(), index.source, " holds no tensor named ", piece.name,
                 " (it holds ", index.pieces.size(), " tensors); was it saved from another model?");
      const std::vector<SavedPiece>& saved = found->second;
      LOOM_CHECK(saved.front().global_shape == piece.global_shape, piece.name, " was saved with global shape ",
                 saved.front().global_shape, " in ", index.source, ", but this model's has shape ", piece.global_shape);
      int64_t covered = 0;
      for (const SavedPiece& s : saved) {
        std::optional<Chunk> overlap = intersect(s.chunk, piece.chunk);
        if (!overlap) continue;
        covered += overlap->numel();
        plan.items.push_back({t, p, s.file, s.key, relative_to(*overlap, s.chunk), relative_to(*overlap, piece.chunk)});
      }
      LOOM_CHECK(covered == piece.chunk.numel(), "sharded checkpoint ", index.source, " does not cover ", piece.name,
                 " ", piece.chunk.str(), ": its saved pieces hold ", covered, " of those ", piece.chunk.numel(),
                 " elements (saved: ", saved.size(), " pieces); a file is missing, or the layout that saved it wrote "
                 "a replicated tensor nowhere");
    }
  }
  return plan;
}

void execute(const LoadPlan& plan, const CheckpointIndex& index, ShardedState& wanted) {
  NoGradGuard no_grad;
  for (const ReadItem& item : plan.items) {
    LocalTensor& local = wanted.at(item.target);
    const Piece& piece = local.pieces.at(item.target_piece);
    const Tensor* saved = index.files.at(item.file).tensors.find(item.key);
    LOOM_CHECK(saved != nullptr, index.file_names.at(item.file), " holds no tensor ", item.key);
    LOOM_CHECK(saved->dtype() == local.tensor.dtype(), piece.name, " was saved as ", saved->dtype(),
               " but this run holds it as ", local.tensor.dtype(), "; convert the checkpoint or the model first");
    Tensor destination = narrowed(piece_view(local, piece), item.wanted_box);
    destination.copy_(narrowed(*saved, item.saved_box));
  }
}

void load(const CheckpointIndex& index, ShardedState& wanted) { execute(plan_load(index, wanted), index, wanted); }

std::string LoadPlan::str(const CheckpointIndex& index, const ShardedState& wanted) const {
  std::ostringstream out;
  for (const ReadItem& item : items) {
    const Piece& piece = wanted.at(item.target).pieces.at(item.target_piece);
    Chunk absolute = item.wanted_box;
    for (size_t d = 0; d < absolute.offsets.size(); ++d) absolute.offsets[d] += piece.chunk.offsets[d];
    out << piece.name << " " << absolute.str() << " <- " << index.file_names.at(item.file) << " " << item.key << " "
        << item.saved_box.str() << "\n";
  }
  return out.str();
}

std::vector<size_t> LoadPlan::files_read() const {
  std::set<size_t> files;
  for (const ReadItem& item : items) files.insert(item.file);
  return {files.begin(), files.end()};
}

}  // namespace loom::distributed::checkpoint
