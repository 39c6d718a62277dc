// distributed::ShardedGradScaler: float16 loss scaling where each rank holds part of the
// gradients (Note [One verdict on inf for every rank], parallel/sharded_grad_scaler.h).
// Ranks are threads (tests/rank_threads.h).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/grad_scaler.h"
#include "nn/optim/sgd.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/fsdp/state_dict.h"  // defines: full_state_dict
#include "parallel/sharded_grad_scaler.h"
#include "fsdp_harness.h"  // defines: Batches, make_batches, shard, max_state_diff
#include "rank_threads.h"  // defines: run_ranks

using namespace loom;
using namespace loom::testing;
using distributed::Communicator;

namespace {

struct Verdict {
  bool stepped = false;
  double scale = 0;
  float first_weight = 0;
};

// One scaled step of SGD on a 4-element parameter whose gradient holds an inf on rank 0
// only (the shard where a float16 gradient overflowed), with the scaler `make` builds.
template <class MakeScaler>
std::vector<Verdict> one_step_with_inf_on_rank0(const MakeScaler& make) {
  std::vector<Verdict> verdicts(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    Tensor p = ones({4}).requires_grad_(true);
    optim::SGD opt({p}, {.lr = 0.5});
    std::unique_ptr<optim::GradScaler> scaler = make(comm);
    const float inf = std::numeric_limits<float>::infinity();
    const float g = static_cast<float>(scaler->get_scale());
    Tensor grad = from_vector(r == 0 ? std::vector<float>{inf, g, g, g} : std::vector<float>{g, g, g, g}, {4});
    p.set_grad(grad);
    verdicts[r].stepped = scaler->step(opt);
    scaler->update();
    verdicts[r].scale = scaler->get_scale();
    verdicts[r].first_weight = p.detach().tolist<float>()[1];
  }));
  return verdicts;
}

}  // namespace

TEST_CASE("an overflow in one rank's shard: GradScaler alone splits the ranks, ShardedGradScaler skips on every rank") {
  // The failure it prevents: rank 1 steps and keeps its scale, rank 0 skips and halves it.
  const auto alone = one_step_with_inf_on_rank0([](const std::shared_ptr<Communicator>&) {
    return std::make_unique<optim::GradScaler>(optim::GradScalerOptions{.init_scale = 1024});
  });
  CHECK_FALSE(alone[0].stepped);
  CHECK(alone[1].stepped);
  CHECK(alone[0].scale == 512);
  CHECK(alone[1].scale == 1024);
  CHECK(alone[1].first_weight == doctest::Approx(0.5));  // 1 - 0.5 * (1024 / 1024)

  const auto sharded = one_step_with_inf_on_rank0([](const std::shared_ptr<Communicator>& comm) {
    return std::make_unique<distributed::ShardedGradScaler>(std::vector<std::shared_ptr<Communicator>>{comm},
                                                            optim::GradScalerOptions{.init_scale = 1024});
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK_FALSE(sharded[r].stepped);
    CHECK(sharded[r].scale == 512);
    CHECK(sharded[r].first_weight == 1.0f);  // untouched
  }
}

TEST_CASE("ShardedGradScaler with finite gradients steps like GradScaler, and skips null and one-rank groups") {
  const auto sharded = one_step_with_inf_on_rank0([](const std::shared_ptr<Communicator>&) {
    // No group that spans both ranks: each decides alone, as GradScaler does.
    return std::make_unique<distributed::ShardedGradScaler>(std::vector<std::shared_ptr<Communicator>>{nullptr},
                                                            optim::GradScalerOptions{.init_scale = 1024});
  });
  CHECK_FALSE(sharded[0].stepped);
  CHECK(sharded[1].stepped);
}

// FSDP2 under float16 autocast: the overflowing first steps are skipped on every rank and
// the scale follows DDP's, so the weights end as DDP's do (DDP's ranks hold the same
// all-reduced gradients and agree without any reduction).
TEST_CASE("fully_shard under float16 autocast with ShardedGradScaler ends with DDP's weights and DDP's scales") {
  manual_seed(31);
  auto start = nn::resnet_tiny(10, 4);
  const int world = 2, steps = 8;
  const Batches data = make_batches(steps, 4, kFloat32);
  // 2^17 overflows float16 (max 65504) in the first backward passes: skipped steps, then steps.
  const optim::GradScalerOptions options{.init_scale = 131072.0};

  using Run = std::function<void(nn::Module&, optim::GradScaler&, int rank, std::vector<double>& scales,
                                 std::vector<bool>& stepped)>;
  const Run train = [&](nn::Module& model, optim::GradScaler& scaler, int rank, std::vector<double>& scales,
                        std::vector<bool>& stepped) {
    optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      Tensor loss;
      {
        autocast::Guard autocast(DeviceType::CPU, kFloat16);
        loss = cross_entropy(model(shard(data.images[s], rank, world)), shard(data.labels[s], rank, world));
      }
      scaler.scale(loss).backward();
      stepped.push_back(scaler.step(opt));
      scaler.update();
      scales.push_back(scaler.get_scale());
    }
  };

  std::vector<OrderedDict<Tensor>> ddp_states(world), fsdp_states(world);
  std::vector<std::vector<double>> ddp_scales(world), fsdp_scales(world);
  std::vector<std::vector<bool>> ddp_stepped(world), fsdp_stepped(world);
  std::vector<std::shared_ptr<nn::Module>> ddp_replicas, fsdp_replicas;
  for (int r = 0; r < world; ++r) {
    ddp_replicas.push_back(start->clone());
    fsdp_replicas.push_back(start->clone());
  }
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    ddp::DistributedDataParallel ddp(ddp_replicas[r], comm);
    optim::GradScaler scaler(options);
    train(ddp, scaler, r, ddp_scales[r], ddp_stepped[r]);
    ddp_states[r] = ddp_replicas[r]->state_dict();
  }));
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto fsdp = fsdp::fully_shard(fsdp_replicas[r], comm);
    distributed::ShardedGradScaler scaler({comm}, options);
    train(*fsdp, scaler, r, fsdp_scales[r], fsdp_stepped[r]);
    fsdp_states[r] = fsdp::full_state_dict(*fsdp, /*rank0_only=*/false);
  }));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(fsdp_stepped[r] == ddp_stepped[r]);
    CHECK(fsdp_scales[r] == ddp_scales[r]);
    const double diff = max_state_diff(fsdp_states[r], ddp_states[r]);
    MESSAGE("rank ", r, ": max |FSDP2 - DDP| = ", diff, ", scale ", fsdp_scales[r].back());
    CHECK(diff <= 1e-5);
  }
  // The run holds both kinds of step, or it shows nothing.
  CHECK_FALSE(ddp_stepped[0].front());
  CHECK(ddp_stepped[0].back());
}
