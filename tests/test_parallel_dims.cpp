// ParallelDims (parallel/parallel_dims.h): the degrees validated once, -1 inferred, every
// rank's coordinates, and the mesh [pp, dp_replicate, dp_shard, tp] with its flattened
// "batch" group, built by 8 thread ranks; tensor-parallel peers read the same data.
#include <doctest/doctest.h>

#include <set>

#include "core/factory.h"             // defines: full
#include "parallel/parallel_dims.h"  // defines: ParallelDims
#include "rank_threads.h"            // defines: run_rank_threads

using namespace loom;
using loom::distributed::ParallelDims;

namespace {

ParallelDims degrees(int pp, int dp_replicate, int dp_shard, int tp) {
  ParallelDims d;
  d.pp = pp;
  d.dp_replicate = dp_replicate;
  d.dp_shard = dp_shard;
  d.tp = tp;
  return d;
}

}  // namespace

TEST_CASE("ParallelDims::make: the product is the world, -1 inferred, every error names the numbers") {
  ParallelDims d = ParallelDims::make(degrees(2, 1, -1, 2), 8);
  CHECK(d.dp_shard == 2);
  CHECK(d.str() == "pp=2 dp_replicate=1 dp_shard=2 tp=2 (world 8)");
  CHECK(d.pp_enabled());
  CHECK(d.dp_shard_enabled());
  CHECK(d.fsdp_enabled());
  CHECK_FALSE(d.dp_replicate_enabled());
  CHECK(d.tp_enabled());
  CHECK(d.batch_size() == 2);
  CHECK(d.mesh_dim_names() == std::vector<std::string>{"pp", "dp_shard", "tp"});
  CHECK(d.mesh_shape() == std::vector<int>{2, 2, 2});

  ParallelDims one = ParallelDims::make(degrees(1, 1, -1, 1), 1);
  CHECK(one.dp_shard == 1);
  CHECK_FALSE(one.dp_enabled());
  CHECK(one.mesh_dim_names().empty());
  CHECK(ParallelDims::make(degrees(1, 4, 1, 1), 4).dp_replicate_enabled());

  CHECK_THROWS_WITH_AS(ParallelDims::make(degrees(2, 1, 2, 1), 6),
                       doctest::Contains("multiply to 4 (pp 2 x dp_replicate 1 x dp_shard 2 x tp 1) but WORLD_SIZE is 6"),
                       Error);
  CHECK_THROWS_WITH_AS(ParallelDims::make(degrees(2, 1, -1, 2), 6),
                       doctest::Contains("the world of 6 is not a multiple of pp 2 x dp_replicate 1 x tp 2 = 4"), Error);
  CHECK_THROWS_WITH_AS(ParallelDims::make(degrees(0, 1, 1, 1), 1), doctest::Contains("the pp degree must be at least 1, got 0"),
                       Error);
  CHECK_THROWS_WITH_AS(ParallelDims::make(degrees(1, 1, -2, 1), 1),
                       doctest::Contains("dp_shard degree must be at least 1, or -1"), Error);
  CHECK_THROWS_WITH_AS(ParallelDims::make(degrees(1, 1, 1, 3), 2), doctest::Contains("(pp 1 x dp_replicate 1 x dp_shard 1 x tp 3)"),
                       Error);
}

TEST_CASE("coordinates at pp=2 x dp_replicate=2 x dp_shard=2 x tp=2: row-major, tp fastest; tp peers read alike") {
  ParallelDims d = ParallelDims::make(degrees(2, 2, 2, 2), 16);
  std::set<std::vector<int>> seen;
  for (int r = 0; r < 16; ++r) {
    CAPTURE(r);
    const auto at = d.coordinates(r);
    CHECK(r == ((at.pp * 2 + at.dp_replicate) * 2 + at.dp_shard) * 2 + at.tp);
    CHECK(at.batch == at.dp_replicate * 2 + at.dp_shard);
    seen.insert({at.pp, at.dp_replicate, at.dp_shard, at.tp});
  }
  CHECK(seen.size() == 16);  // every rank its own place
  // Ranks 0 and 1 differ only in tp: the same batch coordinate, so the same data. Ranks 0
  // and 8 differ only in pp: the same data too. Ranks 0 and 2 are different shards.
  CHECK(d.coordinates(0).batch == d.coordinates(1).batch);
  CHECK(d.coordinates(0).batch == d.coordinates(8).batch);
  CHECK(d.coordinates(0).batch != d.coordinates(2).batch);
  CHECK(d.coordinates(13).pp == 1);
  CHECK(d.coordinates(13).dp_replicate == 1);
  CHECK(d.coordinates(13).dp_shard == 0);
  CHECK(d.coordinates(13).tp == 1);
  CHECK_THROWS_WITH_AS(d.coordinates(16), doctest::Contains("rank 16 is outside the world of 16"), Error);
}

TEST_CASE("draw: a block per stage, a row per data shard, a column per tp rank, from coordinates()") {
  const ParallelDims d = ParallelDims::make(degrees(2, 1, 2, 2), 8);
  const std::string picture = d.draw();
  MESSAGE(picture);
  CHECK(picture.find("pp=2 dp_replicate=1 dp_shard=2 tp=2 (world 8)\n") == 0);
  // Stage 1, shard 1: ranks 6 and 7 (tp innermost).
  const size_t stage1 = picture.find("pp 1");
  REQUIRE(stage1 != std::string::npos);
  const size_t row = picture.find("  batch 1 (dp_replicate 0, dp_shard 1)", stage1);
  REQUIRE(row != std::string::npos);
  const std::string line = picture.substr(row, picture.find('\n', row) - row);
  CHECK(line.find("rank 6") != std::string::npos);
  CHECK(line.find("rank 7") > line.find("rank 6"));
}

// The mesh built by 8 ranks (threads) at pp=2 x dp_shard=2 x tp=2: each rank's
// coordinates from the mesh equal coordinates(), the groups hold the right ranks, and
// one all_reduce along "tp" and one along "batch" add what they should.
TEST_CASE("build_mesh at pp=2 x dp_shard=2 x tp=2 on 8 thread ranks: groups, coordinates and the batch group") {
  constexpr int kWorld = 8;
  const ParallelDims d = ParallelDims::make(degrees(2, 1, 2, 2), kWorld);
  std::vector<std::string> problems(kWorld);
  auto errors = loom::testing::run_rank_threads(kWorld, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    distributed::World w{.store = store, .rank = r, .size = kWorld, .timeout = std::chrono::seconds(30)};
    distributed::DeviceMesh mesh = d.build_mesh("cpu", w);
    const auto at = d.coordinates(r);
    std::string& bad = problems[size_t(r)];
    if (mesh.dim_names() != std::vector<std::string>{"pp", "dp_shard", "tp"}) bad += "dims; ";
    if (mesh.local_rank("pp") != at.pp || mesh.local_rank("dp_shard") != at.dp_shard || mesh.local_rank("tp") != at.tp)
      bad += "coordinates; ";
    if (mesh.local_rank("batch") != at.batch || mesh.size("batch") != 2) bad += "batch; ";
    if (mesh.group_ranks("tp") != std::vector<int>{r - at.tp, r - at.tp + 1}) bad += "tp ranks; ";
    if (mesh.group_ranks("pp") != std::vector<int>{r % 4, r % 4 + 4}) bad += "pp ranks; ";
    // tp: the sum of the two tp ranks' world ranks; batch: of the two dp_shard ranks'.
    Tensor t = full({1}, double(r), TensorOptions(kFloat64));
    mesh.group("tp")->all_reduce(t)->wait();
    if (t.item<double>() != double(2 * (r - at.tp) + 1)) bad += "tp all_reduce; ";
    Tensor b = full({1}, double(r), TensorOptions(kFloat64));
    mesh.group("batch")->all_reduce(b)->wait();
    const int base = r - at.dp_shard * 2;
    if (b.item<double>() != double(2 * base + 2)) bad += "batch all_reduce; ";
  });
  loom::testing::require_no_errors(errors);
  for (int r = 0; r < kWorld; ++r) CHECK_MESSAGE(problems[size_t(r)].empty(), "rank ", r, ": ", problems[size_t(r)]);
}

// HSDP (dp_replicate x dp_shard): "batch" is both dimensions flattened, row-major.
TEST_CASE("build_mesh at dp_replicate=2 x dp_shard=2: batch flattens both, and loss is the same ranks") {
  constexpr int kWorld = 4;
  const ParallelDims d = ParallelDims::make(degrees(1, 2, 2, 1), kWorld);
  std::vector<std::string> problems(kWorld);
  auto errors = loom::testing::run_rank_threads(kWorld, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    distributed::World w{.store = store, .rank = r, .size = kWorld, .timeout = std::chrono::seconds(30)};
    distributed::DeviceMesh mesh = d.build_mesh("cpu", w);
    std::string& bad = problems[size_t(r)];
    if (mesh.group_ranks("batch") != std::vector<int>{0, 1, 2, 3}) bad += "batch ranks; ";
    if (mesh.local_rank("batch") != d.coordinates(r).batch || mesh.local_rank("batch") != r) bad += "batch rank; ";
    if (mesh.group("loss") != mesh.group("batch")) bad += "loss is not batch's group; ";
    Tensor t = full({1}, 1.0, TensorOptions(kFloat64));
    mesh.group("batch")->all_reduce(t)->wait();
    if (t.item<double>() != 4.0) bad += "batch all_reduce; ";
  });
  loom::testing::require_no_errors(errors);
  for (int r = 0; r < kWorld; ++r) CHECK_MESSAGE(problems[size_t(r)].empty(), "rank ", r, ": ", problems[size_t(r)]);
}
