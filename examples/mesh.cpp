// Where every rank sits: the degrees, validated as the trainer validates them, and the mesh
// drawn from ParallelDims::coordinates (parallel/parallel_dims.h). Nothing runs in parallel;
// it is the picture of what `loomrun --nproc_per_node WORLD train_cifar10 --pp ... --tp ...`
// would build.
//
//   build/examples/mesh --world 8 --pp 2 --dp-shard -1 --tp 2
#include <cstdio>

#include "core/error.h"              // defines: loom::Error
#include "examples/train/flags.h"    // defines: Flags
#include "parallel/parallel_dims.h"  // defines: ParallelDims

using namespace loom;

int main(int argc, char** argv) {
  try {
    examples::Flags flags("mesh", "Draws the ranks of a world on the mesh [pp, dp_replicate, dp_shard, tp].");
    auto& world = flags.add<int64_t>("world", 8, "processes (WORLD_SIZE)");
    auto& pp = flags.add<int64_t>("pp", 2, "pipeline stages");
    auto& dp_replicate = flags.add<int64_t>("dp-replicate", 1, "replicas");
    auto& dp_shard = flags.add<int64_t>("dp-shard", -1, "shards (-1: what the world leaves)");
    auto& tp = flags.add<int64_t>("tp", 2, "tensor-parallel ranks");
    flags.parse(argc, argv);
    distributed::ParallelDims degrees;
    degrees.pp = static_cast<int>(pp);
    degrees.dp_replicate = static_cast<int>(dp_replicate);
    degrees.dp_shard = static_cast<int>(dp_shard);
    degrees.tp = static_cast<int>(tp);
    const auto dims = distributed::ParallelDims::make(degrees, static_cast<int>(world));
    std::printf("%s", dims.draw().c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "mesh: error: %s\n", e.what());
    return 1;
  }
}
