// FullyShardedDataParallel. Ranks are threads (tests/rank_threads.h), each with its own
// gloo communicator(s).
//
// The contract is the transparency test: after a few SGD steps (momentum, weight decay),
// every sharding strategy ends with the weights DDP ends with on the same data.
#include <doctest/doctest.h>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/trace.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/fsdp/state_dict.h"
#include "rank_threads.h"   // defines: run_ranks, run_rank_threads, max_abs_diff
#include "transparency.h"   // defines: small_net

using namespace loom;
using namespace loom::fsdp;
using namespace loom::testing;
using distributed::Communicator;

TEST_CASE("flat_param_layout: offsets, padding to a multiple of the group, equal shards") {
  auto layout = flat_param_layout({432, 16, 16}, 3);
  CHECK(layout.offsets == std::vector<int64_t>{0, 432, 448});
  CHECK(layout.total == 464);
  CHECK(layout.shard_size == 155);
  CHECK(layout.padded == 465);
  CHECK(flat_param_layout({4, 4}, 2).padded == 8);  // divisible: no padding
  CHECK_THROWS_WITH_AS(flat_param_layout({4}, 0), doctest::Contains("at least 1"), Error);
}

TEST_CASE("plan_units: each policy stage is a unit; the runs between are the stem and the head") {
  std::vector<std::string> resnet = {"Conv2d", "BatchNorm2d", "ReLU", "BasicBlock", "BasicBlock",
                                     "AdaptiveAvgPool2d", "Flatten", "Linear"};
  CHECK(plan_units(resnet, {}) == std::vector<UnitPlan>{{0, 3, "stem"}, {3, 4, "BasicBlock 3"},
                                                         {4, 5, "BasicBlock 4"}, {5, 8, "head"}});
  CHECK(plan_units({"Conv2d", "ReLU"}, {}) == std::vector<UnitPlan>{{0, 2, "root"}});
  CHECK(plan_units({"Conv2d", "ReLU", "Linear"}, {{"Conv2d", "Linear"}}) ==
        std::vector<UnitPlan>{{0, 1, "Conv2d 0"}, {1, 2, "stages 1"}, {2, 3, "Linear 2"}});
  CHECK(parse_sharding_strategy("FULL_shard") == ShardingStrategy::FULL_SHARD);
  CHECK_THROWS_WITH_AS(parse_sharding_strategy("zero3"), doctest::Contains("expected full_shard"), Error);
}

namespace {

struct Batches {
  std::vector<Tensor> images, labels;  // one global batch per step
};

Batches make_batches(int steps, int64_t global_batch, DType dtype) {
  Batches b;
  for (int s = 0; s < steps; ++s) {
    b.images.push_back(randn({global_batch, 3, 8, 8}).to(dtype));
    b.labels.push_back(randint(0, 10, {global_batch}));
  }
  return b;
}

Tensor shard(const Tensor& global, int rank, int world) {
  const int64_t per_rank = global.size(0) / world;
  return global.narrow(0, rank * per_rank, per_rank);
}

void sgd_steps(nn::Module& model, const std::vector<Tensor>& params, const Batches& data, int rank, int world) {
  optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  for (size_t s = 0; s < data.images.size(); ++s) {
    Tensor loss = cross_entropy(model(shard(data.images[s], rank, world)), shard(data.labels[s], rank, world));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// Conv2d and Linear as units: small_net then has three units with parameters and two
// without, so prefetching and freeing happen between units.
const ModuleWrapPolicy kSmallNetPolicy{{"Conv2d", "Linear"}};

// DDP's weights and buffers after the steps, on each of `world` ranks: the reference.
// (BatchNorm's running statistics are rank 0's after each broadcast, then updated by
// the rank's own last forward, so they differ by rank.)
std::vector<OrderedDict<Tensor>> ddp_reference(const std::shared_ptr<nn::Module>& start, const Batches& data, int world) {
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    ddp::DistributedDataParallel ddp(replicas[comm->rank()], comm);
    sgd_steps(ddp, ddp.parameters(), data, comm->rank(), world);
  }));
  std::vector<OrderedDict<Tensor>> states;
  for (const auto& replica : replicas) states.push_back(replica->state_dict());
  return states;
}

double max_state_diff(const OrderedDict<Tensor>& a, const OrderedDict<Tensor>& b) {
  REQUIRE(a.keys() == b.keys());
  double m = 0;
  for (const auto& [key, value] : a) {
    if (!is_floating(value.dtype())) {
      CHECK(value.tolist<int64_t>() == b.find(key)->tolist<int64_t>());
      continue;
    }
    m = std::max(m, max_abs_diff(value, *b.find(key)));
  }
  return m;
}

// Every rank's full state dict after the steps under FSDP.
std::vector<OrderedDict<Tensor>> fsdp_run(const std::shared_ptr<nn::Module>& start, const Batches& data, int world,
                                          FSDPOptions options) {
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  std::vector<OrderedDict<Tensor>> states(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    FullyShardedDataParallel fsdp(replicas[comm->rank()], comm, options);
    sgd_steps(fsdp, fsdp.parameters(), data, comm->rank(), world);
    states[comm->rank()] = full_state_dict(fsdp, /*rank0_only=*/false);
  }));
  return states;
}

}  // namespace

TEST_CASE("transparency: FULL_SHARD, SHARD_GRAD_OP and NO_SHARD end with DDP's weights (small net, float64)") {
  manual_seed(3);
  auto start = small_net();
  for (int world : {2, 3}) {
    const Batches data = make_batches(3, 4 * world, kFloat64);
    const auto reference = ddp_reference(start, data, world);
    for (ShardingStrategy strategy :
         {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD}) {
      CAPTURE(world);
      CAPTURE(std::string(strategy_name(strategy)));
      auto states = fsdp_run(start, data, world, {.sharding_strategy = strategy, .auto_wrap_policy = kSmallNetPolicy});
      for (int r = 0; r < world; ++r) {
        const double diff = max_state_diff(states[r], reference[r]);
        MESSAGE("world ", world, " ", std::string(strategy_name(strategy)), " rank ", r, ": max |FSDP - DDP| = ", diff);
        // The same per-element arithmetic as DDP (scale by 1/N on the way in, sum, the
        // same SGD kernel): equal bits.
        CHECK(diff == 0.0);
      }
    }
  }
}

TEST_CASE("transparency: ResNet (tiny, BatchNorm, float32) under every strategy ends with DDP's weights and buffers") {
  manual_seed(4);
  auto start = nn::resnet_tiny(10, 4);
  const int world = 3;
  const Batches data = make_batches(3, 2 * world, kFloat32);
  const auto reference = ddp_reference(start, data, world);
  for (ShardingStrategy strategy :
       {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD}) {
    CAPTURE(std::string(strategy_name(strategy)));
    auto states = fsdp_run(start, data, world, {.sharding_strategy = strategy});
    for (int r = 0; r < world; ++r) {
      const double diff = max_state_diff(states[r], reference[r]);
      MESSAGE("resnet_tiny world 3 ", std::string(strategy_name(strategy)), " rank ", r, ": max |FSDP - DDP| = ", diff);
      // Equal bits too: FSDP runs the stem unfused (conv1, bn1, relu as stages) where
      // ResNet::forward fuses bn1 and relu, and the fused epilogue computes the same values.
      CHECK(diff == 0.0);
    }
  }
}
