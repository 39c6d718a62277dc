// SyncBatchNorm: on N ranks, the statistics, outputs, gradients and running statistics of
// one BatchNorm2d on the union batch. Ranks are threads (tests/rank_threads.h).
#include <doctest/doctest.h>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/sync_batch_norm.h"

using namespace loom;

#ifdef LOOM_WITH_GLOO
#include "distributed_gradcheck.h"
#include "gradcheck.h"
#include "rank_threads.h"

using distributed::Communicator;
using loom::testing::contains;
using loom::testing::max_abs_diff;
using loom::testing::require_no_errors;
using loom::testing::run_ranks;

namespace {

Tensor shard(const Tensor& global, int rank, int world) {
  const int64_t per_rank = global.size(0) / world;
  return global.narrow(0, rank * per_rank, per_rank);
}

}  // namespace

TEST_CASE("convert_sync_batchnorm converts every BatchNorm2d in place: same tensors, same state_dict") {
  require_no_errors(run_ranks(1, [&](std::shared_ptr<Communicator> comm) {
    auto model = nn::resnet_tiny();
    auto before = model->state_dict();
    const TensorImpl* bn1_weight = model->bn1->weight.unsafe_impl();
    auto converted = nn::convert_sync_batchnorm(model, comm);
    CHECK(converted == model);
    CHECK(model->bn1->sync != nullptr);
    CHECK(model->layer2->at<nn::BasicBlock>(0)->downsample->at<nn::BatchNorm2d>(1)->sync != nullptr);
    CHECK(nn::convert_sync_batchnorm_in_place(*model, comm) == 12);  // 1 stem + 4 x 2 + 3 downsample
    CHECK(model->state_dict().keys() == before.keys());
    CHECK(model->bn1->weight.unsafe_impl() == bn1_weight);
    CHECK(contains(model->bn1->str(), "sync=SyncBatchNorm(gloo, world_size=1)"));
  }));
}

TEST_CASE("SyncBatchNorm on 3 ranks = BatchNorm2d on the union batch: output, gradients, running stats") {
  const int world = 3;
  // An offset mean: the variance must not come from E[x^2] - E[x]^2 (Note [SyncBatchNorm communication]).
  Tensor x = randn({6, 4, 3, 5}, kFloat64) * 0.5 + 1000.0;
  Tensor upstream = randn({6, 4, 3, 5}, kFloat64);
  auto reference = std::make_shared<nn::BatchNorm2d>(4);
  reference->to(kFloat64);
  {
    NoGradGuard no_grad;
    reference->weight.copy_(from_vector<double>({1, 2, -1, 0.5}, {4}));
    reference->bias.copy_(from_vector<double>({0, 1, 2, 3}, {4}));
  }
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(reference->clone());
  Tensor x_ref = x.clone().requires_grad_();
  Tensor y_ref = reference->forward(x_ref);
  (y_ref * upstream).sum().backward();

  std::vector<Tensor> y(world), dx(world), dw(world), db(world), rm(world), rv(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto bn = std::dynamic_pointer_cast<nn::BatchNorm2d>(replicas[r]);
    nn::convert_sync_batchnorm_in_place(*bn, comm);
    Tensor xr = shard(x, r, world).clone().requires_grad_();
    y[r] = bn->forward(xr);
    (y[r] * shard(upstream, r, world)).sum().backward();
    dx[r] = xr.grad();
    dw[r] = bn->weight.grad();
    db[r] = bn->bias.grad();
    rm[r] = bn->running_mean;
    rv[r] = bn->running_var;
  }));
  Tensor dw_sum = dw[0] + dw[1] + dw[2], db_sum = db[0] + db[1] + db[2];
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(max_abs_diff(y[r], shard(y_ref, r, world)) < 1e-9);
    CHECK(max_abs_diff(dx[r], shard(x_ref.grad(), r, world)) < 1e-9);
    CHECK(max_abs_diff(rm[r], reference->running_mean) < 1e-9);
    CHECK(max_abs_diff(rv[r], reference->running_var) < 1e-9);
  }
  // weight and bias get each rank's own share (DDP averages them); the shares add up.
  CHECK(max_abs_diff(dw_sum, reference->weight.grad()) < 1e-9);
  CHECK(max_abs_diff(db_sum, reference->bias.grad()) < 1e-9);
}

TEST_CASE("sync_batch_norm's gradients match finite differences across 3 ranks with unequal shards") {
  // Rank r normalises images [offset_r, offset_r + count_r) of one batch with statistics
  // over all of them: 1, 3 and 2 images, so the counts in Chan's formula differ.
  const std::vector<int64_t> offset = {0, 1, 4}, count = {1, 3, 2};
  Tensor x = loom::testing::leaf({6, 3, 2, 2}, 11, 0.7) + 2.0;  // an offset mean, as above
  x = x.detach().requires_grad_();
  Tensor weight = loom::testing::leaf({3}, 12), bias = loom::testing::leaf({3}, 13);
  loom::testing::distributed_gradcheck(
      3,
      [&](Communicator& comm, const std::vector<Tensor>& in) {
        const int r = comm.rank();
        Tensor running_mean = zeros({3}, kFloat64), running_var = ones({3}, kFloat64);
        return sync_batch_norm(in[0].narrow(0, offset[r], count[r]), running_mean, running_var, in[1], in[2],
                               /*momentum=*/0.1, /*eps=*/1e-5, comm);
      },
      {x, weight, bias});
}

TEST_CASE("a rank with an empty batch contributes nothing: the others normalise by their own images, not NaN") {
  Tensor x = randn({3, 2, 2, 2}, kFloat64);
  auto reference = std::make_shared<nn::BatchNorm2d>(2);
  reference->to(kFloat64);
  Tensor want = reference->forward(x);
  std::vector<Tensor> out(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto bn = nn::SyncBatchNorm(2, comm);
    bn->to(kFloat64);
    const int r = comm->rank();
    Tensor mine = (r == 0 ? x : zeros({0, 2, 2, 2}, kFloat64)).clone().requires_grad_();
    out[r] = bn->forward(mine);
    out[r].sum().backward();  // the backward's all_reduce runs on both ranks too
  }));
  CHECK(max_abs_diff(out[0], want) < 1e-12);
  CHECK(out[1].shape() == Shape{0, 2, 2, 2});
}

TEST_CASE("eval mode and world size 1 are plain BatchNorm2d, without communication") {
  require_no_errors(run_ranks(1, [&](std::shared_ptr<Communicator> comm) {
    Tensor x = randn({4, 3, 2, 2});
    auto plain = std::make_shared<nn::BatchNorm2d>(3);
    auto synced = nn::SyncBatchNorm(3, comm);
    CHECK(max_abs_diff(synced->forward(x), plain->forward(x)) == 0);
    synced->eval();
    plain->eval();
    CHECK(max_abs_diff(synced->forward(x), plain->forward(x)) == 0);
  }));
}

TEST_CASE("transparency with batch statistics: DDP + SyncBatchNorm ResNet = one ResNet on the union batch") {
  const int world = 2, per_rank = 3, steps = 2;
  manual_seed(5);
  auto start = nn::resnet_tiny(10, 4);
  start->to(kFloat64);
  std::vector<Tensor> images, labels;
  for (int s = 0; s < steps; ++s) {
    images.push_back(randn({world * per_rank, 3, 8, 8}, kFloat64));
    labels.push_back(randint(0, 10, {world * per_rank}));
  }
  auto train = [&](nn::Module& model, int rank, int ranks, std::vector<Tensor>* first_grads) {
    optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
    for (int s = 0; s < steps; ++s) {
      Tensor loss = cross_entropy(model(shard(images[s], rank, ranks)), shard(labels[s], rank, ranks));
      opt.zero_grad();
      loss.backward();
      if (s == 0)
        for (const Tensor& p : model.parameters()) first_grads->push_back(p.grad().clone());
      opt.step();
    }
  };
  auto reference = start->clone();
  std::vector<Tensor> reference_grads;
  train(*reference, 0, 1, &reference_grads);

  std::vector<std::shared_ptr<nn::Module>> replicas = {start->clone(), start->clone()};
  std::vector<std::vector<Tensor>> grads(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto model = nn::convert_sync_batchnorm(replicas[r], comm);
    ddp::DistributedDataParallel ddp(model, comm);
    train(ddp, r, world, &grads[r]);
  }));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    for (size_t i = 0; i < reference_grads.size(); ++i) CHECK(max_abs_diff(grads[r][i], reference_grads[i]) < 1e-10);
    auto got = replicas[r]->state_dict(), want = reference->state_dict();
    for (const auto& [key, t] : want) {
      const std::string& name = key;  // See Note [doctest messages name no structured binding]
      CAPTURE(name);
      CHECK(max_abs_diff((*got.find(name)).to(kFloat64), t.to(kFloat64)) < 1e-10);  // parameters and running stats
    }
  }
}

#endif  // LOOM_WITH_GLOO
