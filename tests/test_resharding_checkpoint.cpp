// Resharding checkpoints (parallel/checkpoint/): a state saved under one layout loads under
// any other. Each layout here is a pure function from the global tensors to what each rank
// holds, so the whole matrix runs in one thread: every rank of layout A packs its pieces,
// the files are indexed, and every rank of layout B plans and loads its own; B's ranks
// together must then hold exactly the tensors A saved (float64, bitwise).
//
// Mutation checks (run by hand, see the commit that added this file): relative_to ignoring
// the outer chunk's offsets (a plan that reads the right pieces at the wrong place) fails
// the matrix; the flat-range decomposition ending its head box one element early fails the
// "flat ranges" case and the matrix; index_files accepting overlapping unequal pieces fails
// "refusals".
#include <doctest/doctest.h>

#include <functional>
#include <map>

#include "core/factory.h"
#include "core/tensor.h"
#include "parallel/checkpoint/chunks.h"
#include "parallel/checkpoint/convert.h"
#include "parallel/checkpoint/load_plan.h"
#include "parallel/checkpoint/sharded_state.h"
#include "parallel/distributed_checkpoint.h"  // defines: write_shard, write_manifest (the disk round trip)
#include "temp_dir.h"                         // defines: TempDir

using namespace loom;
using namespace loom::distributed;
using namespace loom::distributed::checkpoint;

namespace {

// Every element index of `chunk` of a tensor of `shape`, flattened, in the chunk's row-major order.
std::vector<int64_t> flat_indices(const Shape& shape, const Chunk& chunk) {
  std::vector<int64_t> out;
  const Shape strides = contiguous_strides(shape);
  std::vector<int64_t> i(chunk.sizes.size(), 0);
  for (int64_t n = 0; n < chunk.numel(); ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < i.size(); ++d) flat += (chunk.offsets[d] + i[d]) * strides[d];
    out.push_back(flat);
    for (size_t d = i.size(); d-- > 0;) {
      if (++i[d] < chunk.sizes[d]) break;
      i[d] = 0;
    }
  }
  return out;
}

using Globals = std::map<std::string, Tensor>;  // the logical tensors, whole

// A layout: how many ranks, and what rank r holds of `globals` (its local tensors filled
// from them when `fill`, else zeros to be loaded into).
struct Layout {
  std::string name;
  int world;
  std::function<ShardedState(const Globals&, int rank, bool fill)> state;
};

Tensor local_of(const Tensor& global, const Chunk& chunk, int64_t padded_rows, bool fill) {
  Shape shape = chunk.sizes;
  if (!shape.empty()) shape[0] = std::max(shape[0], padded_rows);
  Tensor local = zeros(shape, kFloat64);
  if (fill) {
    Tensor part = global;
    for (size_t d = 0; d < chunk.sizes.size(); ++d)
      part = part.narrow(static_cast<int64_t>(d), chunk.offsets[d], chunk.sizes[d]);
    if (chunk.numel() > 0) local.reshape({local.numel()}).narrow(0, 0, chunk.numel()).copy_(part.reshape({chunk.numel()}));
  }
  return local;
}

// Each tensor cut by `first` then `second` (Replicate() to skip one), FSDP2-style padding of dim 0 when asked.
Layout boxes(std::string name, Placement first, int first_world, Placement second, int second_world, bool pad) {
  const int world = first_world * second_world;
  return {name, world, [=](const Globals& globals, int rank, bool fill) {
            ShardedState state;
            const int r1 = rank / second_world, r2 = rank % second_world;
            for (const auto& [key, global] : globals) {
              Placement a = first, b = second;
              if (global.dim() == 0) a = b = Replicate();  // a 0-d tensor (a step count) is replicated
              if (a.is_shard() && a.dim >= global.dim()) a = Shard(0);
              if (b.is_shard() && b.dim >= global.dim()) b = Shard(0);
              const Chunk chunk = cut(cut(whole_chunk(global.shape()), a, first_world, r1), b, second_world, r2);
              const int64_t rows = pad && b.is_shard() && b.dim == 0 && global.dim() > 0
                                       ? shard_capacity(cut(whole_chunk(global.shape()), a, first_world, r1).sizes[0], second_world)
                                       : 0;
              state.push_back(sharded_2d(key, local_of(global, chunk, rows, fill), global.shape(), a, first_world, r1,
                                         b, second_world, r2));
            }
            return state;
          }};
}

// FSDP1: every tensor flattened and concatenated (name order), padded to a multiple of the
// world, each rank holding one contiguous slice of it: one local tensor with many pieces.
Layout flat(int world) {
  return {"flat " + std::to_string(world), world, [=](const Globals& globals, int rank, bool fill) {
            int64_t total = 0;
            for (const auto& [key, global] : globals) total += global.numel();
            const int64_t capacity = (total + world - 1) / world, begin = capacity * rank, end = begin + capacity;
            LocalTensor local{zeros({capacity}, kFloat64), {}, true};
            int64_t offset = 0;
            for (const auto& [key, global] : globals) {
              const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + global.numel());
              if (hi > lo) {
                int64_t at = lo - begin;
                for (const Chunk& c : chunks_of_flat_range(global.shape(), lo - offset, hi - offset)) {
                  local.pieces.push_back({key, global.shape(), c, at});
                  at += c.numel();
                }
                if (fill)
                  local.tensor.narrow(0, lo - begin, hi - lo)
                      .copy_(global.reshape({global.numel()}).narrow(0, lo - offset, hi - lo));
              }
              offset += global.numel();
            }
            return ShardedState{local};
          }};
}

Globals make_globals() {
  Globals g;
  g["conv.weight"] = randn({5, 3, 3, 3}, kFloat64);
  g["conv.bias"] = randn({5}, kFloat64);
  g["fc.weight"] = randn({10, 7}, kFloat64);
  g["optim.fc.weight.exp_avg"] = randn({10, 7}, kFloat64);
  g["optim.step"] = randn({}, kFloat64);
  g["tiny"] = randn({2}, kFloat64);  // fewer rows than some worlds have ranks
  return g;
}

std::vector<safetensors::File> save_all(const Layout& layout, const Globals& globals) {
  std::vector<safetensors::File> files;
  for (int r = 0; r < layout.world; ++r) files.push_back(pack(layout.state(globals, r, true)));
  return files;
}

std::vector<std::string> names(size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(shard_file_name(static_cast<int>(i), static_cast<int>(n)));
  return out;
}

// Loads `index` under `layout` on every rank and checks each piece against `globals`.
void check_loads_as(const CheckpointIndex& index, const Layout& layout, const Globals& globals) {
  for (int r = 0; r < layout.world; ++r) {
    ShardedState wanted = layout.state(globals, r, false);
    load(index, wanted);
    ShardedState truth = layout.state(globals, r, true);
    for (size_t t = 0; t < wanted.size(); ++t)
      for (const Piece& piece : wanted[t].pieces) {
        CAPTURE(piece.name);
        CAPTURE(r);
        CHECK(piece_view(wanted[t], piece).tolist<double>() == piece_view(truth[t], piece).tolist<double>());
      }
  }
}

std::vector<Layout> layouts() {
  return {boxes("single", Replicate(), 1, Replicate(), 1, false),
          boxes("ddp 2", Replicate(), 2, Replicate(), 1, false),
          boxes("dp_shard 2", Replicate(), 1, Shard(0), 2, true),
          boxes("dp_shard 3", Replicate(), 1, Shard(0), 3, true),
          boxes("tp 2 (dim 1)", Shard(1), 2, Replicate(), 1, false),
          boxes("tp 2 (dim 0) x dp_shard 2", Shard(0), 2, Shard(0), 2, true),
          boxes("tp 2 (dim 1) x dp_shard 3", Shard(1), 2, Shard(0), 3, true),
          boxes("dp_replicate 2 x dp_shard 2", Replicate(), 2, Shard(0), 2, true),
          flat(3),
          flat(4)};
}

}  // namespace

TEST_CASE("flat ranges are the boxes whose row-major orders concatenate to them") {
  for (const Shape& shape : {Shape{7}, Shape{4, 5}, Shape{3, 4, 5}, Shape{2, 3, 1, 4}}) {
    const int64_t n = numel(shape);
    for (int64_t begin = 0; begin <= n; ++begin)
      for (int64_t end = begin; end <= n; ++end) {
        std::vector<int64_t> got;
        const std::vector<Chunk> chunks = chunks_of_flat_range(shape, begin, end);
        for (const Chunk& c : chunks)
          for (int64_t i : flat_indices(shape, c)) got.push_back(i);
        std::vector<int64_t> want;
        for (int64_t i = begin; i < end; ++i) want.push_back(i);
        CAPTURE(shape);
        CAPTURE(begin);
        CAPTURE(end);
        REQUIRE(got == want);
        CHECK(chunks.size() <= std::max<size_t>(1, 2 * shape.size() - 1));
      }
  }
  CHECK(chunks_of_flat_range({}, 0, 1).size() == 1);  // a 0-d tensor
  CHECK_THROWS_WITH_AS(chunks_of_flat_range({4, 5}, 3, 21), doctest::Contains("20 elements"), Error);
}

TEST_CASE("intersect and relative_to") {
  const Chunk rows{{2, 0}, {2, 3}}, cols{{0, 1}, {5, 1}};
  CHECK(intersect(rows, cols) == Chunk{{2, 1}, {2, 1}});
  CHECK_FALSE(intersect(rows, Chunk{{4, 0}, {1, 3}}));
  CHECK(relative_to(Chunk{{2, 1}, {2, 1}}, rows) == Chunk{{0, 1}, {2, 1}});
  CHECK_THROWS_AS(relative_to(cols, rows), Error);
}

TEST_CASE("every layout's checkpoint loads under every other layout, bitwise") {
  manual_seed(0);
  const Globals globals = make_globals();
  int pairs = 0;
  for (const Layout& a : layouts()) {
    const CheckpointIndex index = index_files(save_all(a, globals), names(static_cast<size_t>(a.world)), a.name);
    for (const Layout& b : layouts()) {
      CAPTURE(a.name);
      CAPTURE(b.name);
      check_loads_as(index, b, globals);
      ++pairs;
    }
  }
  CHECK(pairs == 100);
}

TEST_CASE("a replica is written once, and the plan reads each element from one file") {
  manual_seed(1);
  const Globals globals = make_globals();
  const Layout ddp = layouts()[1];
  std::vector<safetensors::File> files = save_all(ddp, globals);
  CHECK(files[0].tensors.size() == globals.size());
  CHECK(files[1].tensors.size() == 0);
  const Layout dp3 = layouts()[3];
  const CheckpointIndex index = index_files(save_all(dp3, globals), names(3), "dp_shard 3");
  // Rank 1 of dp_shard 2 wants rows [3:5] of conv.weight: row 3 from rank 1 of 3, row 4 from rank 2.
  ShardedState wanted = layouts()[2].state(globals, 1, false);
  const LoadPlan plan = plan_load(index, wanted);
  const std::string text = plan.str(index, wanted);
  CHECK(text.find("conv.weight [3:4, 0:3, 0:3, 0:3] <- shard-1-of-3.safetensors conv.weight@2,0,0,0 [1:2, 0:3, 0:3, 0:3]") !=
        std::string::npos);
  CHECK(text.find("conv.weight [4:5, 0:3, 0:3, 0:3] <- shard-2-of-3.safetensors conv.weight@4,0,0,0 [0:1, 0:3, 0:3, 0:3]") !=
        std::string::npos);
  // and the step count, replicated, from the one file that holds it: rank 0's.
  CHECK(text.find("optim.step [] <- shard-0-of-3.safetensors optim.step@ []") != std::string::npos);
  CHECK(plan.files_read() == std::vector<size_t>{0, 1, 2});
}

TEST_CASE("refusals: a missing file, another global shape, overlapping pieces, another dtype") {
  manual_seed(2);
  const Globals globals = make_globals();
  const Layout dp2 = layouts()[2], single = layouts()[0];
  std::vector<safetensors::File> files = save_all(dp2, globals);
  {  // rank 1's file lost: rows nobody saved
    const CheckpointIndex index = index_files({files[0]}, {"shard-0-of-2.safetensors"}, "dir");
    ShardedState wanted = single.state(globals, 0, false);
    CHECK_THROWS_WITH_AS(plan_load(index, wanted), doctest::Contains("does not cover conv.bias [0:5]: its saved pieces hold 3 of those 5"), Error);
  }
  {  // a wider model
    Globals wider = globals;
    wider["fc.weight"] = zeros({12, 7}, kFloat64);
    const CheckpointIndex index = index_files(files, names(2), "dir");
    ShardedState wanted = single.state(wider, 0, false);
    CHECK_THROWS_WITH_AS(plan_load(index, wanted), doctest::Contains("global shape [10, 7]"), Error);
  }
  {  // a tensor the checkpoint does not have
    Globals more = globals;
    more["extra"] = zeros({3}, kFloat64);
    const CheckpointIndex index = index_files(files, names(2), "dir");
    ShardedState wanted = single.state(more, 0, false);
    CHECK_THROWS_WITH_AS(plan_load(index, wanted), doctest::Contains("holds no tensor named extra"), Error);
  }
  {  // two layouts' files mixed: dp_shard 2's rank 0 beside dp_shard 3's rank 1 overlap unequally
    std::vector<safetensors::File> mixed{files[0], save_all(layouts()[3], globals)[1]};
    CHECK_THROWS_WITH_AS(index_files(mixed, names(2), "dir"), doctest::Contains("overlaps"), Error);
  }
  {  // float32 wanted, float64 saved
    const CheckpointIndex index = index_files(files, names(2), "dir");
    ShardedState wanted{whole("conv.bias", zeros({5}, kFloat32))};
    CHECK_THROWS_WITH_AS(load(index, wanted), doctest::Contains("saved as float64"), Error);
  }
  {  // metadata that is not a box
    safetensors::File bad = files[0];
    bad.metadata.insert("dcp.conv.bias@0", "global=5;offsets=x");
    CHECK_THROWS_WITH_AS(index_files({bad}, names(1), "dir"), doctest::Contains("comma-separated integers"), Error);
  }
}

TEST_CASE("on disk: a complete step directory is indexed through its manifest") {
  manual_seed(3);
  const Globals globals = make_globals();
  testing::TempDir dir;
  const std::string step_dir = dir.path.string() + "/" + step_dir_name(4);
  const Layout a = layouts()[6];  // tp 2 (dim 1) x dp_shard 3
  std::vector<safetensors::File> files = save_all(a, globals);
  for (int r = 0; r < a.world; ++r) write_shard(step_dir, r, a.world, files[r].tensors, files[r].metadata);
  write_manifest(step_dir, a.world);
  const CheckpointIndex index = read_checkpoint_index(step_dir);
  CHECK(index.file_names.size() == 6);
  check_loads_as(index, layouts()[9], globals);  // flat 4
  remove_manifest(step_dir);
  CHECK_THROWS_WITH_AS(read_checkpoint_index(step_dir), doctest::Contains("is incomplete"), Error);
}

TEST_CASE("consolidate: every tensor whole from any layout's set; a one-rank set of them reads back alike") {
  manual_seed(4);
  const Globals globals = make_globals();
  const Layout flat3 = layouts()[8];
  const CheckpointIndex index = index_files(save_all(flat3, globals), names(3), "flat 3");
  const OrderedDict<Tensor> model = consolidate(index, /*with_optimizer=*/false);
  CHECK(model.size() == globals.size() - 2);  // the two "optim." tensors left out
  const OrderedDict<Tensor> all = consolidate(index, /*with_optimizer=*/true);
  REQUIRE(all.size() == globals.size());
  for (const auto& entry : globals) {  // Note [doctest messages name no structured binding]
    const std::string& name = entry.first;
    CAPTURE(name);
    REQUIRE(all.find(name) != nullptr);
    CHECK(all.find(name)->tolist<double>() == entry.second.tolist<double>());
  }
  testing::TempDir dir;
  const std::string step_dir = dir.path.string() + "/" + step_dir_name(0);
  write_one_rank_set(all, step_dir);
  check_loads_as(read_checkpoint_index(step_dir), layouts()[6], globals);  // tp 2 (dim 1) x dp_shard 3
}
