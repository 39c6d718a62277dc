// Pipeline stages as processes (parallel/pipeline/pipeline_stage.h), with threads as
// ranks (tests/rank_threads.h): at 2 and 3 ranks, under GPipe, 1F1B and interleaved 1F1B
// (V = 2), the weights after 2 SGD steps are bitwise those of the in-process Pipeline
// with the same balance, micro-batches and schedule; and the faults: a stage that throws
// mid-step (forward, backward, the loss), ranks that disagree on the balance, a wrong
// balance, a stage whose output shape changes. None hangs.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <optional>

#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/pipeline/pipeline.h"        // defines: Pipeline, the reference
#include "parallel/pipeline/pipeline_stage.h"  // defines: PipelineStage
#include "rank_threads.h"                      // defines: run_ranks, require_no_errors, contains
#include "transparency.h"                      // defines: small_net

using namespace loom;
using loom::parallel::pipeline::Pipeline;
using loom::parallel::pipeline::PipelineStage;
using loom::testing::contains;
using loom::testing::require_no_errors;
using loom::testing::run_ranks;
using loom::testing::small_net;

namespace {

Tensor loss_of(const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }

struct Batch {
  Tensor images, labels;
};

std::vector<Batch> batches(int n, int64_t size) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back({randn({size, 3, 8, 8}, kFloat64), randint(0, 10, {size})});
  return out;
}

// The owner (virtual stage) of each layer of a Sequential cut by `balance`.
std::vector<int64_t> virtual_stage_of_layer(const std::vector<int64_t>& balance) {
  std::vector<int64_t> out;
  for (size_t c = 0; c < balance.size(); ++c)
    for (int64_t k = 0; k < balance[c]; ++k) out.push_back(int64_t(c));
  return out;
}

// A layer that throws from its forward on its `when`-th call (counting from 1).
struct ThrowOnCall : nn::Cloneable<ThrowOnCall> {
  explicit ThrowOnCall(int when) : Cloneable("ThrowOnCall"), when(when) {}
  void reset() override {}
  Tensor forward(const Tensor& x) override {
    LOOM_CHECK(++calls != when, "boom on call ", calls);
    return x;
  }
  int when, calls = 0;
};

// A layer that, once `grow` is set, appends a copy of its input's first feature.
struct Grow : nn::Cloneable<Grow> {
  Grow() : Cloneable("Grow") {}
  void reset() override {}
  Tensor forward(const Tensor& x) override { return grow ? cat({x, x.narrow(1, 0, 1)}, 1) : x; }
  bool grow = false;
};

}  // namespace

TEST_CASE("stages as processes: GPipe, 1F1B and interleaved 1F1B give the in-process pipeline's weights bit for bit") {
  // 2 SGD steps and a third on a smaller batch.
  struct Case {
    int ranks;
    std::vector<int64_t> balance;
    std::string schedule;
    int64_t n_microbatches, batch;
  };
  const std::vector<Case> cases = {
      {2, {2, 4}, "gpipe", 4, 8},          {2, {3, 3}, "1f1b", 3, 7},  // micro-batches 3, 3, 1
      {2, {1, 2, 1, 2}, "interleaved_1f1b", 4, 8}, {2, {2, 1, 1, 2}, "interleaved_1f1b", 3, 7},
      {3, {2, 2, 2}, "gpipe", 4, 9},       {3, {1, 2, 3}, "1f1b", 5, 10},
      {3, {1, 1, 1, 1, 1, 1}, "interleaved_1f1b", 3, 9}, {3, {1, 1, 1, 1, 1, 1}, "interleaved_1f1b", 4, 8}};
  for (const Case& c : cases) {
    CAPTURE(c.ranks);
    CAPTURE(c.schedule);
    CAPTURE(c.n_microbatches);
    CAPTURE(c.batch);
    manual_seed(5);
    auto reference_net = small_net();
    std::vector<std::shared_ptr<nn::Sequential>> nets;  // every rank's own copy of the model
    for (int r = 0; r < c.ranks; ++r) {
      nets.push_back(small_net());
      nets.back()->load_state_dict(reference_net->state_dict());
    }
    std::vector<Batch> data = batches(2, c.batch);
    data.push_back(batches(1, 5)[0]);  // an epoch's last, smaller batch: fewer micro-batches, the same shapes agreed
    std::vector<Device> devices;
    for (int r = 0; r < c.ranks; ++r) devices.push_back(Device(DeviceType::CPU, r));
    Pipeline reference(reference_net, devices, c.balance, c.n_microbatches, c.schedule, loss_of);
    optim::SGD opt(reference.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
    std::vector<double> reference_losses;
    std::vector<std::vector<double>> reference_outputs;
    for (const Batch& b : data) {
      opt.zero_grad();
      const auto result = reference.step(b.images, b.labels);
      reference_losses.push_back(result.loss.item<double>());
      reference_outputs.push_back(result.output.to(Device("cpu")).tolist<double>());
      opt.step();
    }
    std::vector<std::vector<double>> losses(size_t(c.ranks)), outputs;  // outputs: the last stage's
    std::vector<std::map<std::string, std::vector<double>>> trained(size_t(c.ranks));  // before share_weights
    auto errors = run_ranks(c.ranks, [&](std::shared_ptr<distributed::Communicator> comm) {
      const int r = comm->rank();
      PipelineStage stage(nets[size_t(r)], c.balance, comm, Device("cpu"), c.n_microbatches, c.schedule, loss_of);
      std::optional<optim::SGD> sgd;  // a stage of ReLU and Flatten has nothing to train
      if (!stage.parameters().empty())
        sgd.emplace(stage.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
      for (const Batch& b : data) {
        if (sgd) sgd->zero_grad();
        auto result = stage.step(b.images, b.labels);
        losses[size_t(r)].push_back(result.loss.item<double>());
        CHECK(result.output.defined() == stage.is_last());
        if (stage.is_last()) outputs.push_back(result.output.tolist<double>());
        if (sgd) sgd->step();
      }
      for (const auto& [name, t] : nets[size_t(r)]->state_dict()) trained[size_t(r)][name] = t.tolist<double>();
      stage.share_weights();  // every rank: the whole model as trained
    });
    for (const auto& e : errors) CHECK(e == "");
    for (int r = 0; r < c.ranks; ++r) CHECK(losses[size_t(r)] == reference_losses);  // all-reduced to every rank
    CHECK(outputs == reference_outputs);  // what a trainer's accuracy is computed from
    // Every layer's parameters on the rank that owns it: bitwise the reference's; after
    // share_weights, on every rank.
    const auto owner = virtual_stage_of_layer(c.balance);
    for (const auto& [key, want] : reference_net->state_dict()) {
      const std::string& name = key;  // See Note [doctest messages name no structured binding]
      CAPTURE(name);
      const int64_t layer = std::stoll(name.substr(0, name.find('.')));
      const auto rank = size_t(owner[size_t(layer)] % c.ranks);
      const std::vector<double> expected = want.to(Device("cpu")).tolist<double>();
      CHECK(trained[rank][name] == expected);
      for (int r = 0; r < c.ranks; ++r) CHECK(nets[size_t(r)]->state_dict().find(name)->tolist<double>() == expected);
    }
  }
}

TEST_CASE("a stage that throws mid-step: every rank stops with an error naming the stage, its rank, the micro-batch "
          "and the pass; no hang; later steps refuse") {
  struct Case {
    int ranks;
    std::vector<int64_t> balance;  // of small_net with ThrowOnCall after layer 2 (7 layers)
    std::string schedule;
    int failing;  // the stage that holds ThrowOnCall
    std::string pass;
    int call = 3;  // ThrowOnCall's: the forward of micro-batch call - 1
  };
  const std::vector<Case> cases = {{2, {3, 4}, "1f1b", 1, "forward of micro-batch 2"},
                                   {2, {4, 3}, "gpipe", 0, "forward of micro-batch 2"},
                                   {3, {2, 2, 3}, "1f1b", 1, "forward of micro-batch 2"},
                                   {3, {1, 1, 1, 1, 1, 2}, "interleaved_1f1b", 0, "forward of micro-batch 2 on virtual stage 3"},
                                   // The first step's first micro-batch: before any shape header went out.
                                   {3, {2, 2, 3}, "gpipe", 1, "forward of micro-batch 0", 1},
                                   {2, {1, 1, 2, 3}, "interleaved_1f1b", 0, "forward of micro-batch 0 on virtual stage 2", 1}};
  for (const Case& c : cases) {
    CAPTURE(c.ranks);
    CAPTURE(c.schedule);
    manual_seed(2);
    std::vector<std::shared_ptr<nn::Sequential>> nets;
    for (int r = 0; r < c.ranks; ++r) {
      auto net = small_net();
      auto layers = net->children();
      layers.insert(layers.begin() + 3, std::make_shared<ThrowOnCall>(c.call));
      nets.push_back(std::make_shared<nn::Sequential>(layers));
    }
    const Batch b = batches(1, 8)[0];
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_ranks(
        c.ranks,
        [&](std::shared_ptr<distributed::Communicator> comm) {
          PipelineStage stage(nets[size_t(comm->rank())], c.balance, comm, Device("cpu"), 4, c.schedule, loss_of);
          try {
            stage.step(b.images, b.labels);
          } catch (const Error& e) {
            CHECK_THROWS_WITH_AS(stage.step(b.images, b.labels), doctest::Contains("an earlier step failed"), Error);
            throw;
          }
        },
        std::chrono::seconds(20));
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));  // not the 20 s timeout
    const std::string f = std::to_string(c.failing);
    for (int r = 0; r < c.ranks; ++r) {
      CAPTURE(errors[size_t(r)]);
      if (r == c.failing)
        CHECK(contains(errors[size_t(r)], "PipelineStage: stage " + f + " (rank " + f + " of the pipeline group, cpu:0) "
                                          "failed in the " + c.pass + ": boom on call " + std::to_string(c.call)));
      else
        CHECK(contains(errors[size_t(r)], "PipelineStage: stage " + f + " (rank " + f + " of the pipeline group) "
                                          "failed in the " + c.pass + "; stage " + std::to_string(r) + " stopped"));
    }
  }
}

TEST_CASE("a stage that throws in a backward, and a loss that throws on the last stage, stop every rank") {
  manual_seed(4);
  std::vector<std::shared_ptr<nn::Sequential>> nets = {small_net(), small_net(), small_net()};
  const Batch b = batches(1, 6)[0];
  // Rank 0's first convolution throws when its gradient of micro-batch 1 arrives.
  auto errors = run_ranks(3, [&](std::shared_ptr<distributed::Communicator> comm) {
    PipelineStage stage(nets[size_t(comm->rank())], {2, 2, 2}, comm, Device("cpu"), 3, "1f1b", loss_of);
    int calls = 0;
    if (comm->rank() == 0)
      stage.parameters()[0].register_hook([&calls](const Tensor& g) {
        LOOM_CHECK(++calls != 2, "a gradient hook refuses");
        return g;
      });
    stage.step(b.images, b.labels);
  });
  CHECK(contains(errors[0], "stage 0 (rank 0 of the pipeline group, cpu:0) failed in the backward of micro-batch 1: a "
                            "gradient hook refuses"));
  for (int r : {1, 2}) CHECK(contains(errors[size_t(r)], "stage 0 (rank 0 of the pipeline group) failed in the backward "
                                                         "of micro-batch 1; stage " + std::to_string(r) + " stopped"));
  // Labels out of range fail in the last stage's loss of micro-batch 0.
  errors = run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    PipelineStage stage(nets[size_t(comm->rank())], {3, 3}, comm, Device("cpu"), 2, "gpipe", loss_of);
    stage.step(b.images, full({6}, 99, TensorOptions(kInt64)));
  });
  CHECK(contains(errors[1], "stage 1 (rank 1 of the pipeline group, cpu:0) failed in the forward of micro-batch 0:"));
  CHECK(contains(errors[0], "stage 1 (rank 1 of the pipeline group) failed in the forward of micro-batch 0; stage 0"));
}

TEST_CASE("ranks that disagree on the balance, a balance of the wrong sum or count: clear errors on every rank") {
  manual_seed(6);
  std::vector<std::shared_ptr<nn::Sequential>> nets = {small_net(), small_net()};
  auto errors = run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    const std::vector<int64_t> balance = comm->rank() == 0 ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{3, 3};
    PipelineStage stage(nets[size_t(comm->rank())], balance, comm, Device("cpu"), 2, "1f1b", loss_of);
  });
  CHECK(contains(errors[0], "the ranks of the pipeline group disagree on the pipeline: rank 0 has balance [2, 4], "
                            "n_microbatches 2, schedule 1f1b but rank 1 has balance [3, 3], n_microbatches 2, schedule 1f1b"));
  CHECK(contains(errors[1], "rank 1 has balance [3, 3], n_microbatches 2, schedule 1f1b but rank 0 has balance [2, 4]"));
  errors = run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    PipelineStage stage(nets[size_t(comm->rank())], {2, 2}, comm, Device("cpu"), 2, "1f1b", loss_of);
  });
  for (const auto& e : errors) CHECK(contains(e, "the balance covers 4 layers, but the Sequential has 6"));
  errors = run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    PipelineStage stage(nets[size_t(comm->rank())], {2, 2, 2}, comm, Device("cpu"), 2, "interleaved_1f1b", loss_of);
  });
  for (const auto& e : errors) CHECK(contains(e, "the balance has 3 entries for a pipeline of 2 stages"));
  errors = run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    PipelineStage stage(nets[size_t(comm->rank())], {1, 2, 1, 2}, comm, Device("cpu"), 2, "1f1b", loss_of);
  });
  for (const auto& e : errors) CHECK(contains(e, "which only interleaved_1f1b runs; 1f1b needs 2 entries"));
}

TEST_CASE("a stage whose output shape changes after the first step: a clear error, every rank stops") {
  manual_seed(8);
  std::vector<std::shared_ptr<nn::Module>> layers = {std::make_shared<nn::Linear>(4, 5), std::make_shared<Grow>(),
                                                     std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(5, 3)};
  std::vector<std::shared_ptr<nn::Sequential>> nets;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::shared_ptr<nn::Module>> copy;
    for (const auto& l : layers) copy.push_back(l->clone());
    nets.push_back(std::make_shared<nn::Sequential>(copy));
    nets.back()->to(kFloat64);
  }
  Tensor x = randn({4, 4}, kFloat64), y = randint(0, 3, {4});
  auto errors = run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    PipelineStage stage(nets[size_t(comm->rank())], {2, 2}, comm, Device("cpu"), 2, "1f1b", loss_of);
    stage.step(x, y);
    if (comm->rank() == 0) std::dynamic_pointer_cast<Grow>(nets[0]->children()[1])->grow = true;
    stage.step(x, y);
  });
  CHECK(contains(errors[0], "stage 0 (rank 0 of the pipeline group, cpu:0) failed in the forward of micro-batch 0: "
                            "stage 0's output is Tensor[float64, [2, 6], cpu:0], but the stages agreed at the "
                            "first step on float64 [micro-batch] + [5]"));
  CHECK(contains(errors[1], "stage 0 (rank 0 of the pipeline group) failed in the forward of micro-batch 0; stage 1 "
                            "stopped"));
}

TEST_CASE("two pipelines side by side, each over its own group of a 4-rank world (pp x dp's layout)") {
  // World ranks 0..3 as a 2 x 2 mesh ("pp", "dp"), row-major: pipeline d holds world ranks
  // d and d + 2, and its stage is the world rank / 2. Each pipeline trains its own shard.
  manual_seed(12);
  auto reference_net = small_net();
  std::vector<std::shared_ptr<nn::Sequential>> nets;
  for (int r = 0; r < 4; ++r) {
    nets.push_back(small_net());
    nets.back()->load_state_dict(reference_net->state_dict());
  }
  const std::vector<Batch> shards = batches(2, 6);  // pipeline d's batch: shards[d]
  std::vector<std::shared_ptr<nn::Sequential>> references;
  for (int d = 0; d < 2; ++d) {
    references.push_back(small_net());
    references.back()->load_state_dict(reference_net->state_dict());
    Pipeline pipe(references.back(), {"cpu:0", "cpu:1"}, {1, 2, 1, 2}, 3, "interleaved_1f1b", loss_of);
    pipe.step(shards[size_t(d)].images, shards[size_t(d)].labels);
  }
  auto errors = loom::testing::run_rank_threads(4, [&](int world_rank, std::shared_ptr<distributed::TCPStore> store) {
    const int dp = world_rank % 2, pp = world_rank / 2;
    auto group = std::make_shared<distributed::GlooCommunicator>(store, "pipeline" + std::to_string(dp), pp, 2);
    PipelineStage stage(nets[size_t(world_rank)], {1, 2, 1, 2}, group, Device("cpu"), 3, "interleaved_1f1b", loss_of);
    CHECK(stage.stage_index() == pp);
    stage.step(shards[size_t(dp)].images, shards[size_t(dp)].labels);
  });
  for (const auto& e : errors) CHECK(e == "");
  // Each rank's own virtual stages' gradients: its pipeline's reference's.
  for (int world_rank = 0; world_rank < 4; ++world_rank) {
    const auto owner = virtual_stage_of_layer({1, 2, 1, 2});
    const auto mine = nets[size_t(world_rank)]->named_parameters(), want = references[size_t(world_rank % 2)]->named_parameters();
    for (const auto& [key, p] : mine) {
      const std::string& name = key;  // See Note [doctest messages name no structured binding]
      const int64_t layer = std::stoll(name.substr(0, name.find('.')));
      if (owner[size_t(layer)] % 2 != world_rank / 2) continue;
      CAPTURE(name);
      CHECK(p.grad().tolist<double>() == want.find(name)->grad().tolist<double>());
    }
  }
}
