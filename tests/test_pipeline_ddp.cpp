// 2-D parallelism, pp x dp (parallel/pipeline/stage_replicas.h): pipelines of processes
// side by side on a DeviceMesh ("pp", "dp"), each stage data-parallel over its replicas.
// Ranks are threads. The contract: after SGD steps with momentum and weight decay, every
// stage's weights are those of the in-process Pipeline (same balance, micro-batches, schedule)
// stepping on the average of its gradients over the replicas' shards.
#include <doctest/doctest.h>

#include <omp.h>  // defines: omp_set_num_threads (one core per rank)

#include <map>
#include <optional>

#include "autograd/grad_mode.h"                // defines: NoGradGuard
#include "autograd/ops.h"                      // defines: cross_entropy
#include "nn/optim/sgd.h"                      // defines: SGD
#include "parallel/device_mesh.h"              // defines: DeviceMesh
#include "parallel/pipeline/pipeline.h"        // defines: Pipeline, the reference
#include "parallel/pipeline/stage_replicas.h"  // defines: replicate_stage
#include "rank_threads.h"                      // defines: run_rank_threads, require_no_errors
#include "transparency.h"                      // defines: small_net

using namespace loom;
using loom::parallel::pipeline::PipelineStage;
using loom::testing::require_no_errors;
using loom::testing::run_rank_threads;
using loom::testing::small_net;

namespace {

Tensor loss_of(const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }

struct Batch {
  Tensor images, labels;
};

struct Case {
  int pp, dp;
  std::vector<int64_t> balance;
  std::string schedule;
  int64_t n_microbatches;
};

constexpr int kSteps = 3;
const optim::SGDOptions kSGD{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};

// The reference: one in-process Pipeline; each step accumulates the gradients of every
// replica's shard and divides by the number of replicas, which is what the replicas'
// all-reduce computes.
std::map<std::string, std::vector<double>> reference_weights(const Case& c, std::shared_ptr<nn::Sequential> net,
                                                             const std::vector<std::vector<Batch>>& data) {
  std::vector<Device> devices;
  for (int s = 0; s < c.pp; ++s) devices.push_back(Device(DeviceType::CPU, s));
  parallel::pipeline::Pipeline pipe(net, devices, c.balance, c.n_microbatches, c.schedule, loss_of);
  optim::SGD opt(pipe.parameters(), kSGD);
  for (const auto& shards : data) {
    opt.zero_grad();
    for (const Batch& b : shards) pipe.step(b.images, b.labels);
    {
      NoGradGuard no_grad;
      for (Tensor& p : pipe.parameters()) p.grad().mul_(1.0 / c.dp);
    }
    opt.step();
  }
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : net->named_parameters()) out[name] = t.to(Device("cpu")).tolist<double>();
  return out;
}

}  // namespace

TEST_CASE("pp x dp: each stage's replicas train as the in-process pipeline on the average of their shards") {
  const std::vector<Case> cases = {
      {2, 2, {3, 3}, "1f1b", 1},  // one micro-batch: DDP over a model cut in two
      {2, 2, {2, 4}, "gpipe", 4},
      {2, 2, {3, 3}, "1f1b", 3},
      {2, 3, {3, 3}, "1f1b", 2},
      {3, 2, {1, 1, 1, 1, 1, 1}, "interleaved_1f1b", 3},  // virtual stages of ReLU / Flatten: nothing to replicate
  };
  for (const Case& c : cases) {
    CAPTURE(c.pp);
    CAPTURE(c.dp);
    CAPTURE(c.schedule);
    CAPTURE(c.n_microbatches);
    manual_seed(11);
    auto reference_net = small_net();
    const int world = c.pp * c.dp;
    std::vector<std::shared_ptr<nn::Sequential>> nets;  // every rank's own copy of the model
    for (int r = 0; r < world; ++r) {
      nets.push_back(small_net());
      nets.back()->load_state_dict(reference_net->state_dict());
    }
    std::vector<std::vector<Batch>> data(kSteps);  // [step][replica]
    for (auto& shards : data)
      for (int d = 0; d < c.dp; ++d) shards.push_back({randn({6, 3, 8, 8}, kFloat64), randint(0, 10, {6})});
    const auto want = reference_weights(c, reference_net, data);

    std::vector<std::map<std::string, std::vector<double>>> trained(static_cast<size_t>(world));
    auto errors = run_rank_threads(world, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
      omp_set_num_threads(1);
      distributed::World w{.store = store, .rank = r, .size = world, .timeout = std::chrono::seconds(30)};
      distributed::DeviceMesh mesh("cpu", {c.pp, c.dp}, {"pp", "dp"}, w);
      auto& net = nets[static_cast<size_t>(r)];
      PipelineStage stage(net, c.balance, mesh.group("pp"), Device("cpu"), c.n_microbatches, c.schedule, loss_of);
      parallel::pipeline::replicate_stage(stage, mesh.group("dp"));
      std::optional<optim::SGD> sgd;
      if (!stage.parameters().empty()) sgd.emplace(stage.parameters(), kSGD);
      for (const auto& shards : data) {
        if (sgd) sgd->zero_grad();
        const Batch& b = shards[static_cast<size_t>(mesh.local_rank("dp"))];
        stage.step(b.images, b.labels);
        if (sgd) sgd->step();
      }
      // The virtual stage's names are its own ("0.weight"); the whole model's are what the
      // reference keys by, so translate through the identity of the tensors.
      std::map<const void*, std::string> whole;
      for (const auto& [name, t] : net->named_parameters()) whole[t.data_ptr<double>()] = name;
      std::map<std::string, std::vector<double>> renamed;
      for (const auto& layers : stage.local_virtual_stages())
        for (const auto& [name, t] : layers->named_parameters())
          renamed[whole.at(t.data_ptr<double>())] = t.tolist<double>();
      trained[static_cast<size_t>(r)] = renamed;
    });
    require_no_errors(errors);
    size_t compared = 0;
    for (int r = 0; r < world; ++r) {
      for (const auto& [key, got] : trained[static_cast<size_t>(r)]) {
        const std::string& name = key;  // See Note [doctest messages name no structured binding]
        CAPTURE(r);
        CAPTURE(name);
        const auto& expected = want.at(name);
        REQUIRE(got.size() == expected.size());
        double diff = 0;
        for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::abs(got[i] - expected[i]));
        CHECK(diff < 1e-12);  // float64; the sums' order differs (all-reduce vs accumulation)
        ++compared;
      }
    }
    CHECK(compared == static_cast<size_t>(c.dp) * want.size());  // every parameter on each of its replicas
  }
}
