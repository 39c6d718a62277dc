// ZeroRedundancyOptimizer (ZeRO-1): the greedy partition as a pure function, and the
// contract: DDP + ZeRO-1 ends with the weights of DDP + SGD, bit for bit (Note [Same
// arithmetic, same bits]), with a state_dict a plain SGD can load. Ranks are threads
// (tests/rank_threads.h).
#include <doctest/doctest.h>

#include <numeric>

#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/zero_redundancy_optimizer.h"

using namespace loom;
using parallel::partition_parameters;
using parallel::ZeroRedundancyOptimizer;

namespace {

// Every rank's element total.
std::vector<int64_t> totals(const std::vector<std::vector<std::vector<size_t>>>& owned,
                            const std::vector<std::vector<int64_t>>& numels) {
  std::vector<int64_t> out;
  for (const auto& rank : owned) {
    int64_t sum = 0;
    for (size_t g = 0; g < rank.size(); ++g)
      for (size_t i : rank[g]) sum += numels[g][i];
    out.push_back(sum);
  }
  return out;
}

// Each parameter of each group is owned by exactly one rank, in its own group.
void check_exact_cover(const std::vector<std::vector<std::vector<size_t>>>& owned,
                       const std::vector<std::vector<int64_t>>& numels) {
  for (size_t g = 0; g < numels.size(); ++g) {
    std::vector<int> count(numels[g].size(), 0);
    for (const auto& rank : owned) {
      REQUIRE(rank.size() == numels.size());
      for (size_t i : rank[g]) ++count.at(i);
    }
    CHECK(count == std::vector<int>(numels[g].size(), 1));
  }
}

}  // namespace

TEST_CASE("partition_parameters: largest first to the emptiest rank, ties to the lowest rank") {
  const std::vector<std::vector<int64_t>> numels = {{5, 10, 7, 9, 8, 6}};
  auto owned = partition_parameters(numels, 2);
  // 10 -> r0, 9 -> r1, 8 -> r1 (9 < 10), 7 -> r0 (10 < 17), 6 -> r0 (17 = 17: lowest), 5 -> r1.
  CHECK(owned[0][0] == std::vector<size_t>{1, 2, 5});
  CHECK(owned[1][0] == std::vector<size_t>{0, 3, 4});
  CHECK(totals(owned, numels) == std::vector<int64_t>{23, 22});
  CHECK(partition_parameters(numels, 2) == owned);  // deterministic: every rank computes the same
  // Equal sizes keep registration order: the first goes to rank 0.
  auto equal = partition_parameters({{4, 4, 4}}, 3);
  CHECK(equal[0][0] == std::vector<size_t>{0});
  CHECK(equal[1][0] == std::vector<size_t>{1});
  CHECK(equal[2][0] == std::vector<size_t>{2});
}

TEST_CASE("partition_parameters: ResNet18's 62 parameters over 2..4 ranks are balanced to within one tensor") {
  std::vector<std::vector<int64_t>> numels(1);
  int64_t largest = 0;
  for (const Tensor& p : nn::resnet18(10)->parameters()) {
    numels[0].push_back(p.numel());
    largest = std::max(largest, p.numel());
  }
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    auto owned = partition_parameters(numels, world);
    check_exact_cover(owned, numels);
    auto t = totals(owned, numels);
    const auto [lo, hi] = std::minmax_element(t.begin(), t.end());
    CHECK(*hi - *lo <= largest);  // greedy's guarantee
    CHECK(*hi <= 11173962 / world + largest);
  }
}

TEST_CASE("partition_parameters: groups stay groups, totals carry over, more ranks than parameters") {
  const std::vector<std::vector<int64_t>> numels = {{100, 1}, {50, 50, 2}};
  auto owned = partition_parameters(numels, 2);
  check_exact_cover(owned, numels);
  // Group 0: 100 -> r0, 1 -> r1. Group 1 starts from totals {100, 1}: 50 -> r1, 50 -> r1, 2 -> r0.
  CHECK(owned[0][0] == std::vector<size_t>{0});
  CHECK(owned[1][0] == std::vector<size_t>{1});
  CHECK(owned[0][1] == std::vector<size_t>{2});
  CHECK(owned[1][1] == std::vector<size_t>{0, 1});
  // A later group never moves an earlier one's parameters.
  CHECK(partition_parameters({numels[0]}, 2)[1][0] == owned[1][0]);

  auto many = partition_parameters({{3, 2}, {1}}, 5);
  check_exact_cover(many, {{3, 2}, {1}});
  CHECK(many[3] == std::vector<std::vector<size_t>>{{}, {}});
  CHECK(many[4] == std::vector<std::vector<size_t>>{{}, {}});
  CHECK(partition_parameters({}, 3) == std::vector<std::vector<std::vector<size_t>>>(3));
  CHECK_THROWS_WITH_AS(partition_parameters({{1}}, 0), doctest::Contains("world_size must be positive, got 0"), Error);
}

#ifdef LOOM_WITH_GLOO
#include "rank_threads.h"
#include "transparency.h"  // defines: small_net, max_param_diff

using loom::testing::contains;
using loom::testing::max_param_diff;
using loom::testing::require_no_errors;
using loom::testing::run_ranks;
using loom::testing::small_net;
using distributed::Communicator;

namespace {

struct Batches {
  std::vector<Tensor> images, labels;
};

Batches make_batches(int steps, int64_t global_batch, int64_t side, DType dtype) {
  Batches b;
  for (int s = 0; s < steps; ++s) {
    b.images.push_back(randn({global_batch, 3, side, side}, dtype));
    b.labels.push_back(randint(0, 10, {global_batch}));
  }
  return b;
}

Tensor shard(const Tensor& global, int rank, int world) {
  const int64_t per_rank = global.size(0) / world;
  return global.narrow(0, rank * per_rank, per_rank);
}

const optim::SGDOptions kSGD{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};

// Weights with weight decay, biases without and at half the lr: two groups.
std::vector<optim::ParamGroup> two_groups(const nn::Module& model) {
  optim::ParamGroup decay{{}, {}}, no_decay{{}, {{"weight_decay", 0.0}, {"lr", 0.05}}};
  for (const auto& [name, p] : model.named_parameters())
    (p.dim() > 1 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

// DDP on this rank's shards for data.images.size() steps, with `opt`; after step 0 the
// first group's lr drops as a scheduler would drop it.
void train(nn::Module& ddp, optim::Optimizer& opt, const Batches& data, int rank, int world) {
  for (size_t s = 0; s < data.images.size(); ++s) {
    Tensor loss = cross_entropy(ddp(shard(data.images[s], rank, world)), shard(data.labels[s], rank, world));
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (s == 0) opt.param_groups()[0]["lr"] = 0.05;
  }
}

}  // namespace

TEST_CASE("transparency: DDP + ZeRO-1 weights equal DDP + SGD weights bit for bit (small net, tiny ResNet; 2, 3 ranks)") {
  struct Case {
    const char* model;
    int world;
    bool groups;
  };
  for (Case c : {Case{"small", 2, false}, Case{"small", 3, true}, Case{"resnet_tiny", 2, true},
                 Case{"resnet_tiny", 3, false}}) {
    CAPTURE(c.model);
    CAPTURE(c.world);
    CAPTURE(c.groups);
    manual_seed(7);
    const bool small = std::string(c.model) == "small";
    std::shared_ptr<nn::Module> start = small ? std::shared_ptr<nn::Module>(small_net()) : nn::resnet_tiny(10);
    const Batches data = make_batches(3, 4 * c.world, small ? 8 : 16, small ? kFloat64 : kFloat32);
    std::vector<std::shared_ptr<nn::Module>> plain, zero;
    for (int r = 0; r < c.world; ++r) {
      plain.push_back(start->clone());
      zero.push_back(start->clone());
    }
    std::vector<OrderedDict<Tensor>> sgd_state(c.world);
    std::vector<size_t> owned(c.world);
    require_no_errors(run_ranks(c.world, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      {
        ddp::DistributedDataParallel ddp(plain[r], comm);
        auto opt = c.groups ? std::make_unique<optim::SGD>(two_groups(*plain[r]), kSGD)
                            : std::make_unique<optim::SGD>(plain[r]->parameters(), kSGD);
        train(ddp, *opt, data, r, c.world);
        sgd_state[r] = opt->state_dict();
      }
      ddp::DistributedDataParallel ddp(zero[r], comm);
      auto factory = parallel::optimizer_class<optim::SGD>(kSGD);
      auto opt = c.groups ? std::make_unique<ZeroRedundancyOptimizer>(two_groups(*zero[r]), factory, comm)
                          : std::make_unique<ZeroRedundancyOptimizer>(zero[r]->parameters(), factory, comm);
      train(ddp, *opt, data, r, c.world);
      owned[r] = opt->state_tensors().size();
      opt->consolidate_state_dict(0);
      if (r == 0) {
        // The whole state on rank 0, in SGD's own format: same keys, same order, same bits.
        OrderedDict<Tensor> whole = opt->state_dict();
        CHECK(whole.keys() == sgd_state[0].keys());
        for (const auto& [k, value] : sgd_state[0]) {
          const std::string& key = k;  // See Note [doctest messages name no structured binding]
          CAPTURE(key);
          CHECK(testing::max_abs_diff(whole[key], value) == 0.0);
        }
      }
    }));
    const size_t num_params = start->parameters().size();
    CHECK(std::accumulate(owned.begin(), owned.end(), size_t{0}) == num_params);  // each buffer on one rank
    for (int r = 0; r < c.world; ++r) {
      CAPTURE(r);
      CHECK(owned[r] < num_params);
      CHECK(max_param_diff(*zero[r], *plain[0]) == 0.0);
      CHECK(max_param_diff(*plain[r], *plain[0]) == 0.0);
    }
  }
}

TEST_CASE("consolidate_state_dict: a plain SGD loads it; load_state_dict keeps each rank's partition and resumes exactly") {
  manual_seed(8);
  const int world = 3;
  auto start = small_net();
  const Batches data = make_batches(4, 4 * world, 8, kFloat64);
  const Batches first{{data.images.begin(), data.images.begin() + 2}, {data.labels.begin(), data.labels.begin() + 2}};
  const Batches rest{{data.images.begin() + 2, data.images.end()}, {data.labels.begin() + 2, data.labels.end()}};
  // Reference: one process, plain SGD, 2 steps, save, load into a fresh SGD, 2 more steps.
  auto reference = start->clone();
  OrderedDict<Tensor> saved_by_zero;
  std::vector<std::shared_ptr<nn::Module>> resumed;
  for (int r = 0; r < world; ++r) resumed.push_back(start->clone());
  std::vector<size_t> loaded(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto model = start->clone();
    ddp::DistributedDataParallel ddp(model, comm);
    ZeroRedundancyOptimizer opt(two_groups(*model), parallel::optimizer_class<optim::SGD>(kSGD), comm);
    train(ddp, opt, first, r, world);
    opt.consolidate_state_dict(1);  // to a rank other than 0
    if (r == 1) saved_by_zero = opt.state_dict();
    comm->barrier()->wait();
    // Resume on fresh models and optimizers from the whole state, on every rank.
    ddp::DistributedDataParallel again(resumed[r], comm);
    {
      NoGradGuard no_grad;
      resumed[r]->load_state_dict(model->state_dict());
    }
    ZeroRedundancyOptimizer opt2(two_groups(*resumed[r]), parallel::optimizer_class<optim::SGD>(kSGD), comm);
    opt2.load_state_dict(saved_by_zero);
    loaded[r] = opt2.state_tensors().size();
    for (const Tensor& t : opt2.state_tensors()) CHECK(t.dtype() == kFloat64);
    CHECK(opt2.param_groups()[0]["lr"] == 0.05);  // the group's hyperparameters came back too
    train(again, opt2, rest, r, world);
  }));
  CHECK(std::accumulate(loaded.begin(), loaded.end(), size_t{0}) == start->parameters().size());
  {
    optim::SGD sgd(two_groups(*reference), kSGD);
    auto plain_model = start->clone();
    train(*reference, sgd, first, 0, 1);
    optim::SGD fresh(two_groups(*plain_model), kSGD);
    fresh.load_state_dict(saved_by_zero);  // loads into a plain SGD: same format
    CHECK(fresh.state_dict().keys() == sgd.state_dict().keys());
    train(*reference, sgd, rest, 0, 1);
  }
  // Sharded training over 3 ranks against one process: gradients are averaged in a
  // different order, so to rounding.
  for (int r = 0; r < world; ++r) CHECK(max_param_diff(*resumed[r], *reference) < 1e-12);
}

TEST_CASE("bad input: differing parameters or groups across ranks, state_dict where nothing was consolidated, bad `to`") {
  auto shapes = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto net = std::make_shared<nn::Linear>(4, comm->rank() == 0 ? 6 : 5);
    ZeroRedundancyOptimizer opt(net->parameters(), parallel::optimizer_class<optim::SGD>(kSGD), comm);
  });
  for (const std::string& e : shapes) {
    CHECK_MESSAGE(contains(e, "ZeroRedundancyOptimizer: parameter 0 (\"group 0, parameter 0\""), e);
    CHECK(contains(e, "float32 [6, 4] on rank 0"));
    CHECK(contains(e, "float32 [5, 4] on rank 1"));
  }
  auto groups = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto net = std::make_shared<nn::Linear>(4, 4);
    std::vector<optim::ParamGroup> g = {{{net->weight, net->bias}, {}}};
    if (comm->rank() == 1) g = {{{net->weight}, {}}, {{net->bias}, {}}};
    ZeroRedundancyOptimizer opt(g, parallel::optimizer_class<optim::SGD>(kSGD), comm);
  });
  for (const std::string& e : groups) CHECK_MESSAGE(contains(e, "the ranks split their parameters into different param groups"), e);

  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto net = std::make_shared<nn::Linear>(4, 4);
    ZeroRedundancyOptimizer opt(net->parameters(), parallel::optimizer_class<optim::SGD>(kSGD), comm);
    CHECK_THROWS_WITH_AS(opt.state_dict(), doctest::Contains("has not been consolidated since the last step"), Error);
    CHECK_THROWS_WITH_AS(opt.consolidate_state_dict(2), doctest::Contains("to=2 is not a rank of the process group "
                                                                          "(its ranks are 0 .. 1)"), Error);
    CHECK_THROWS_WITH_AS(opt.add_param_group({{ones({2}).requires_grad_()}, {}}),
                         doctest::Contains("add_param_group is not supported"), Error);
    opt.consolidate_state_dict(0);
    if (comm->rank() == 1)
      CHECK_THROWS_WITH_AS(opt.state_dict(), doctest::Contains("the state was consolidated on rank 0"), Error);
    else
      CHECK(opt.state_dict().contains("param_groups.0.lr"));
    net->weight.set_grad(ones({4, 4}));
    opt.step();  // the consolidated copy is stale now
    if (comm->rank() == 0)
      CHECK_THROWS_WITH_AS(opt.state_dict(), doctest::Contains("not been consolidated since the last step"), Error);
  }));
  auto to = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto net = std::make_shared<nn::Linear>(4, 4);
    ZeroRedundancyOptimizer opt(net->parameters(), parallel::optimizer_class<optim::SGD>(kSGD), comm);
    opt.consolidate_state_dict(comm->rank());
  });
  for (const std::string& e : to) CHECK_MESSAGE(contains(e, "every rank must pass the same `to`"), e);
}

TEST_CASE("model_state_bytes: a ZeRO-1 rank holds all parameters and gradients but only its partition's momentum") {
  manual_seed(9);
  auto start = small_net();  // float64
  int64_t param_bytes = 0;
  for (const Tensor& p : start->parameters()) param_bytes += static_cast<int64_t>(p.nbytes());
  Tensor x = randn({4, 3, 8, 8}, kFloat64);
  std::vector<int64_t> bytes(2), momentum(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto model = start->clone();
    ddp::DistributedDataParallel ddp(model, comm);
    ZeroRedundancyOptimizer opt(model->parameters(), parallel::optimizer_class<optim::SGD>(kSGD), comm);
    ddp(x).sum().backward();
    opt.step();
    bytes[comm->rank()] = nn::model_state_bytes(*model, opt);
    for (const Tensor& t : opt.state_tensors()) momentum[comm->rank()] += static_cast<int64_t>(t.nbytes());
  }));
  CHECK(momentum[0] + momentum[1] == param_bytes);
  CHECK(momentum[0] > 0);
  CHECK(momentum[1] > 0);
  for (int r = 0; r < 2; ++r) CHECK(bytes[r] == 2 * param_bytes + momentum[r]);
}

#endif  // LOOM_WITH_GLOO
