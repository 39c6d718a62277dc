// Where every rank sits: the degrees, validated as the trainer validates them, and the mesh
// drawn from ParallelDims::coordinates (parallel/parallel_dims.h). Nothing runs in parallel;
// it is the picture of what `loomrun --nproc_per_node WORLD train_cifar10 --pp ... --tp ...`
// would build.
//
//   build/examples/mesh --world 8 --pp 2 --dp-shard -1 --tp 2
//
// With --parameter ROWS,COLS it prints instead, as JSON, the boxes of one [ROWS, COLS]
// parameter each rank holds (FSDP1's flat slices or FSDP2's rows of its tp shard, cut
// along --tp-dim): the boxes a sharded checkpoint records (Note [Every layout is a set of
// boxes], parallel/checkpoint/chunks.h), which bench/shard_picture.py draws.
//
//   build/examples/mesh --world 4 --pp 1 --dp-shard 2 --tp 2 --parameter 9,6 --fsdp-layout per_parameter
#include <algorithm>
#include <charconv>  // defines: from_chars (--parameter)
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"                        // defines: loom::Error
#include "train/flags.h"              // defines: Flags
#include "parallel/checkpoint/sharded_state.h" // defines: cut, Chunk, chunks_of_flat_range
#include "parallel/parallel_dims.h"            // defines: ParallelDims

using namespace loom;
namespace ckpt = loom::distributed::checkpoint;

namespace {

// The degrees are ints (ParallelDims): a larger count would wrap, not fail.
constexpr double kMaxWorld = 65536;

std::string json(const ckpt::Chunk& c) {
  return "{\"offsets\": [" + std::to_string(c.offsets[0]) + ", " + std::to_string(c.offsets[1]) + "], \"sizes\": [" +
         std::to_string(c.sizes[0]) + ", " + std::to_string(c.sizes[1]) + "]}";
}

// --parameter ROWS,COLS: two positive integers.
std::pair<int64_t, int64_t> parse_shape(const std::string& text) {
  int64_t rows = 0, cols = 0;
  const char* end = text.data() + text.size();
  auto [comma, rows_error] = std::from_chars(text.data(), end, rows);
  bool ok = rows_error == std::errc() && comma < end && *comma == ',';
  if (ok) {
    auto [last, cols_error] = std::from_chars(comma + 1, end, cols);
    ok = cols_error == std::errc() && last == end;
  }
  LOOM_CHECK(ok && rows >= 1 && cols >= 1, "--parameter: expected ROWS,COLS, two positive integers (e.g. 10,6), got '",
             text, "'");
  return {rows, cols};
}

// Each rank's boxes of a [rows, cols] parameter, one JSON line per rank.
void print_boxes(const distributed::ParallelDims& dims, int world, int64_t rows, int64_t cols, int tp_dim,
                 bool per_parameter) {
  const Shape shape{rows, cols};
  for (int rank = 0; rank < world; ++rank) {
    const auto at = dims.coordinates(rank);
    const ckpt::Chunk tp_part = ckpt::cut(ckpt::whole_chunk(shape), distributed::Shard(tp_dim), dims.tp, at.tp);
    std::vector<ckpt::Chunk> boxes;
    if (per_parameter) {  // FSDP2: rows of the tp part (Note [Per-parameter shards])
      boxes.push_back(ckpt::cut(tp_part, distributed::Shard(0), dims.dp_shard, at.dp_shard));
    } else {  // FSDP1: a slice of the tp part flattened and padded to a multiple of dp_shard
      const int64_t n = tp_part.numel(), slice = (n + dims.dp_shard - 1) / dims.dp_shard;
      const int64_t begin = std::min(n, slice * at.dp_shard), end = std::min(n, begin + slice);
      for (ckpt::Chunk c : ckpt::chunks_of_flat_range(tp_part.sizes, begin, end)) {
        for (size_t d = 0; d < 2; ++d) c.offsets[d] += tp_part.offsets[d];
        boxes.push_back(c);
      }
    }
    std::printf("{\"rank\": %d, \"pp\": %d, \"dp_replicate\": %d, \"dp_shard\": %d, \"tp\": %d, \"boxes\": [", rank,
                at.pp, at.dp_replicate, at.dp_shard, at.tp);
    for (size_t i = 0; i < boxes.size(); ++i) std::printf("%s%s", i ? ", " : "", json(boxes[i]).c_str());
    std::printf("]}\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    training::Flags flags("mesh", "Draws the ranks of a world on the mesh [pp, dp_replicate, dp_shard, tp].");
    auto& world = flags.add<int64_t>("world", 8, "processes (WORLD_SIZE)");
    flags.in_range(1, kMaxWorld, "1 to 65536 processes");
    auto& pp = flags.add<int64_t>("pp", 2, "pipeline stages");
    flags.in_range(1, kMaxWorld, "1 to 65536 stages");
    auto& dp_replicate = flags.add<int64_t>("dp-replicate", 1, "replicas");
    flags.in_range(1, kMaxWorld, "1 to 65536 replicas");
    auto& dp_shard = flags.add<int64_t>("dp-shard", -1, "shards (-1: what the world leaves)");
    flags.in_range(-1, kMaxWorld, "-1 (what the world leaves) or 1 to 65536 shards");
    auto& tp = flags.add<int64_t>("tp", 2, "tensor-parallel ranks");
    flags.in_range(1, kMaxWorld, "1 to 65536 tensor-parallel ranks");
    auto& parameter = flags.add<std::string>("parameter", "", "ROWS,COLS: print each rank's boxes of such a parameter");
    auto& tp_dim = flags.add<int64_t>("tp-dim", 1, "--parameter: the dim tp cuts (0: column-parallel, 1: row-parallel)");
    flags.in_range(0, 1, "0 or 1");
    auto& layout = flags.add<std::string>("fsdp-layout", "per_parameter", "--parameter: flat | per_parameter");
    flags.one_of({"flat", "per_parameter"});
    flags.parse(argc, argv);
    flags.check();
    distributed::ParallelDims degrees;
    degrees.pp = static_cast<int>(pp);
    degrees.dp_replicate = static_cast<int>(dp_replicate);
    degrees.dp_shard = static_cast<int>(dp_shard);
    degrees.tp = static_cast<int>(tp);
    const auto dims = distributed::ParallelDims::make(degrees, static_cast<int>(world));
    if (parameter.empty()) {
      std::printf("%s", dims.draw().c_str());
      return 0;
    }
    const auto [rows, cols] = parse_shape(parameter);
    print_boxes(dims, static_cast<int>(world), rows, cols, static_cast<int>(tp_dim), layout == "per_parameter");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mesh: error: %s\n", e.what());
    return 1;
  }
}
