// What the FSDP tests share (tests/test_fsdp.cpp: the flat layout; tests/test_fully_shard.cpp:
// the per-parameter one): global batches that each rank cuts its part of, a few optimizer
// steps, DDP's run on the same data as the reference, and the comparison of state dicts.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/fsdp/state_dict.h"  // defines: full_state_dict
#include "rank_threads.h"              // defines: run_ranks, max_abs_diff

namespace loom::testing {

struct Batches {
  std::vector<Tensor> images, labels;  // one global batch per step
};

inline Batches make_batches(int steps, int64_t global_batch, DType dtype) {
  Batches b;
  for (int s = 0; s < steps; ++s) {
    b.images.push_back(randn({global_batch, 3, 8, 8}).to(dtype));
    b.labels.push_back(randint(0, 10, {global_batch}));
  }
  return b;
}

// Rank `rank`'s part of a global batch.
inline Tensor shard(const Tensor& global, int rank, int world) {
  const int64_t per_rank = global.size(0) / world;
  return global.narrow(0, rank * per_rank, per_rank);
}

inline void train_steps(nn::Module& model, optim::Optimizer& opt, const Batches& data, int rank, int world) {
  for (size_t s = 0; s < data.images.size(); ++s) {
    Tensor loss = cross_entropy(model(shard(data.images[s], rank, world)), shard(data.labels[s], rank, world));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

inline void sgd_steps(nn::Module& model, const std::vector<Tensor>& params, const Batches& data, int rank, int world) {
  optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  train_steps(model, opt, data, rank, world);
}

// The optimizer a run steps, built over the wrapped model (DDP, FSDP) as a user would.
using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(nn::Module& wrapped)>;
inline std::unique_ptr<optim::Optimizer> sgd_over_parameters(nn::Module& wrapped) {
  return std::make_unique<optim::SGD>(wrapped.parameters(),
                                      optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
}

// Conv2d and Linear as units: small_net then has three units with parameters and two
// without, so prefetching and freeing happen between units.
inline const fsdp::ModuleWrapPolicy kSmallNetPolicy{{"Conv2d", "Linear"}};

// DDP's weights and buffers after the steps, on each of `world` ranks: the reference.
// (BatchNorm's running statistics are rank 0's after each broadcast, then updated by
// the rank's own last forward, so they differ by rank.)
inline std::vector<OrderedDict<Tensor>> ddp_reference(const std::shared_ptr<nn::Module>& start, const Batches& data,
                                                      int world, const MakeOptimizer& make = sgd_over_parameters) {
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  require_no_errors(run_ranks(world, [&](std::shared_ptr<distributed::Communicator> comm) {
    ddp::DistributedDataParallel ddp(replicas[comm->rank()], comm);
    auto opt = make(ddp);
    train_steps(ddp, *opt, data, comm->rank(), world);
  }));
  std::vector<OrderedDict<Tensor>> states;
  for (const auto& replica : replicas) states.push_back(replica->state_dict());
  return states;
}

inline double max_state_diff(const OrderedDict<Tensor>& a, const OrderedDict<Tensor>& b) {
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

// Every rank's full state dict after the steps under FSDP (either layout: options'
// per_parameter_sharding).
inline std::vector<OrderedDict<Tensor>> fsdp_run(const std::shared_ptr<nn::Module>& start, const Batches& data,
                                                 int world, fsdp::FSDPOptions options,
                                                 const MakeOptimizer& make = sgd_over_parameters) {
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  std::vector<OrderedDict<Tensor>> states(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<distributed::Communicator> comm) {
    fsdp::FullyShardedDataParallel fsdp(replicas[comm->rank()], comm, options);
    auto opt = make(fsdp);
    train_steps(fsdp, *opt, data, comm->rank(), world);
    states[comm->rank()] = fsdp::full_state_dict(fsdp, /*rank0_only=*/false);
  }));
  return states;
}

// HYBRID_SHARD's groups for rank r of 4, as a row-major 2 x 2 mesh (replicate, shard):
// ranks {0, 1} and {2, 3} are the replicas (the shard groups), {0, 2} and {1, 3} the
// replicate groups.
inline std::pair<std::shared_ptr<distributed::Communicator>, std::shared_ptr<distributed::Communicator>>
hybrid_2x2_groups(int r, const std::shared_ptr<distributed::TCPStore>& store) {
  omp_set_num_threads(1);
  distributed::GlooOptions options;
  options.timeout = std::chrono::seconds(20);
  auto shard = std::make_shared<distributed::GlooCommunicator>(store, "shard" + std::to_string(r / 2), r % 2, 2, options);
  auto replicate = std::make_shared<distributed::GlooCommunicator>(store, "replicate" + std::to_string(r % 2), r / 2, 2,
                                                                   options);
  return {shard, replicate};
}

// Each rank's state against the reference's (DDP's, say): the largest difference, said
// per rank, at most `tolerance` (0: equal bits).
inline void check_equals_reference(const std::vector<OrderedDict<Tensor>>& states,
                                   const std::vector<OrderedDict<Tensor>>& reference, const std::string& what,
                                   double tolerance = 0.0) {
  for (size_t r = 0; r < states.size(); ++r) {
    const double diff = max_state_diff(states[r], reference[r]);
    MESSAGE(what, " rank ", r, ": max |FSDP - reference| = ", diff);
    CHECK(diff <= tolerance);
  }
}

// FSDP under each of `strategies` (the rest of the options from `base`: the wrap policy,
// the layout) against `reference` (ddp_reference on the same batches), to `tolerance`.
inline void check_strategies_against(const std::vector<OrderedDict<Tensor>>& reference,
                                     const std::shared_ptr<nn::Module>& start, const Batches& data, int world,
                                     const std::vector<fsdp::ShardingStrategy>& strategies, fsdp::FSDPOptions base,
                                     const std::string& what, double tolerance = 0.0) {
  for (fsdp::ShardingStrategy strategy : strategies) {
    CAPTURE(std::string(fsdp::strategy_name(strategy)));
    base.sharding_strategy = strategy;
    check_equals_reference(fsdp_run(start, data, world, base), reference,
                           what + " world " + std::to_string(world) + " " + fsdp::strategy_name(strategy), tolerance);
  }
}

// FULL_SHARD, SHARD_GRAD_OP and NO_SHARD at 2 and 3 ranks (3 steps of 4 float64 examples
// per rank), each against DDP's weights on the same batches, bitwise.
inline void check_every_strategy_equals_ddp(const std::shared_ptr<nn::Module>& start, const fsdp::FSDPOptions& base,
                                            const std::string& what) {
  for (int world : {2, 3}) {
    const Batches data = make_batches(3, 4 * world, kFloat64);
    CAPTURE(world);
    check_strategies_against(ddp_reference(start, data, world), start, data, world,
                             {fsdp::ShardingStrategy::FULL_SHARD, fsdp::ShardingStrategy::SHARD_GRAD_OP,
                              fsdp::ShardingStrategy::NO_SHARD},
                             base, what);
  }
}

}  // namespace loom::testing
