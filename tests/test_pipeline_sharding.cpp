// Pipeline parallelism with sharded data parallelism (parallel/pipeline/stage_sharding.h):
// pp x FSDP, pp x HSDP, and pp x ZeRO-1 (a replicated stage with a ZeroRedundancyOptimizer
// over its own parameters). Ranks are threads. The contract, as tests/test_pipeline_ddp.cpp
// states it for pp x DDP: after SGD steps with momentum and weight decay, every stage's
// weights are those of the in-process Pipeline (same balance, micro-batches, schedule)
// stepping on the average of its gradients over the data shards; here with BatchNorm,
// whose running statistics are the ones data shard 0 leaves (rank 0's, broadcast after
// each step). And the costs: what FSDP gathers and reduce-scatters per step, and what a
// rank holds between steps.
#include <doctest/doctest.h>

#include <omp.h>  // defines: omp_set_num_threads (one core per rank)

#include <algorithm>  // defines: std::find
#include <map>
#include <optional>

#include "autograd/grad_mode.h"                   // defines: NoGradGuard
#include "autograd/ops.h"                         // defines: cross_entropy
#include "nn/model_state.h"                       // defines: model_state_bytes
#include "nn/nn.h"                                // defines: Conv2d, BatchNorm2d, ReLU, Flatten, Linear
#include "nn/optim/sgd.h"                         // defines: SGD
#include "parallel/device_mesh.h"                 // defines: DeviceMesh
#include "parallel/fsdp/state_dict.h"             // defines: full_state_dict
#include "parallel/pipeline/pipeline.h"           // defines: Pipeline, the reference
#include "parallel/pipeline/schedule.h"           // defines: virtual_stage
#include "parallel/pipeline/stage_replicas.h"     // defines: replicate_stage
#include "parallel/pipeline/stage_sharding.h"     // defines: shard_stage
#include "parallel/zero_redundancy_optimizer.h"   // defines: ZeroRedundancyOptimizer
#include "rank_threads.h"                         // defines: run_rank_threads, require_no_errors

using namespace loom;
using loom::fsdp::ShardingStrategy;
using loom::parallel::pipeline::PipelineStage;
using loom::testing::require_no_errors;
using loom::testing::run_rank_threads;

namespace {

Tensor loss_of(const Tensor& out, const Tensor& y) { return cross_entropy(out, y); }

// 7 layers: Conv2d(3, 6), BatchNorm2d(6), ReLU, Conv2d(6, 8, stride 2), ReLU, Flatten,
// Linear(128, 10); inputs [N, 3, 8, 8] in float64.
std::shared_ptr<nn::Sequential> bn_net() {
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 6, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(6), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(6, 8, 3, 2, 1), std::make_shared<nn::ReLU>(), std::make_shared<nn::Flatten>(1),
      std::make_shared<nn::Linear>(8 * 4 * 4, 10)});
  net->to(kFloat64);
  return net;
}

std::shared_ptr<nn::Sequential> copy_of(const std::shared_ptr<nn::Sequential>& start) {
  auto net = bn_net();
  net->load_state_dict(start->state_dict());
  return net;
}

struct Batch {
  Tensor images, labels;
};

enum class Mode { FSDP, HSDP, ZeRO1 };

struct Case {
  std::vector<int64_t> balance;  // S entries, or S x V for interleaved_1f1b
  std::string schedule;
};

struct Config {
  Mode mode = Mode::FSDP;
  int replicate = 1, shard = 2;  // dp_replicate x dp_shard (ZeRO-1: dp = shard)
  fsdp::FSDPOptions options{};
  // false: the groups talk over TCP, so FSDP gathers with collective all_gathers
  // (prefetched) instead of one-sided copies from shared memory.
  bool shared_memory = true;
};

constexpr int kPP = 2;
constexpr int kSteps = 3;
constexpr int64_t kMicroBatches = 4;
const optim::SGDOptions kSGD{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};

const std::vector<Case> kCases = {
    {{3, 4}, "gpipe"},
    {{3, 4}, "1f1b"},
    {{1, 2, 2, 2}, "interleaved_1f1b"},  // 2 virtual stages: rank 0 holds virtual stages 0 and 2
};

// The model's state as a map of plain values (integers as doubles), from any device.
std::map<std::string, std::vector<double>> values_of(const OrderedDict<Tensor>& state) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : state) out[name] = t.to(Device("cpu")).to(kFloat64).tolist<double>();
  return out;
}

// The reference: one in-process Pipeline; each step accumulates the gradients of every
// data shard and divides by their number, which is what the replicas' reduce-scatters
// (and all-reduces) compute. The replicas end each step with rank 0's buffers, which
// saw data shard 0 only: so the reference keeps the buffers shard 0 left.
std::map<std::string, std::vector<double>> reference_state(const Case& c, std::shared_ptr<nn::Sequential> net,
                                                           const std::vector<std::vector<Batch>>& data) {
  std::vector<Device> devices;
  for (int s = 0; s < kPP; ++s) devices.push_back(Device(DeviceType::CPU, s));
  parallel::pipeline::Pipeline pipe(net, devices, c.balance, kMicroBatches, c.schedule, loss_of);
  optim::SGD opt(pipe.parameters(), kSGD);
  for (const auto& shards : data) {
    opt.zero_grad();
    std::vector<Tensor> after_shard0;
    for (size_t d = 0; d < shards.size(); ++d) {
      pipe.step(shards[d].images, shards[d].labels);
      if (d == 0)
        for (const Tensor& b : net->buffers()) after_shard0.push_back(b.clone());
    }
    NoGradGuard no_grad;
    const std::vector<Tensor> buffers = net->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) Tensor(buffers[i]).copy_(after_shard0[i]);
    for (Tensor& p : pipe.parameters()) p.grad().mul_(1.0 / static_cast<double>(shards.size()));
    opt.step();
  }
  return values_of(net->state_dict());
}

// What one rank saw.
struct RankResult {
  std::map<std::string, std::vector<double>> state;  // its chunks', under the whole model's names
  std::vector<fsdp::Runtime::CommCounts> counts;     // per local chunk (FSDP)
  std::vector<int64_t> units;                        // per local chunk: units with parameters (FSDP)
  std::vector<int64_t> chunk_params;                 // per local chunk: Ψ of the chunk
  int64_t state_bytes = 0;                           // nn::model_state_bytes(stage, optimizer)
  int64_t expected_bytes = 0;                        // 3 x 8 bytes x each unit's shard (FSDP)
  int64_t gathered_between_steps = 0;                // elements the chunks' own parameters hold
  int64_t optimizer_elements = 0;                    // numel of the optimizer's state (ZeRO-1)
  std::vector<bool> one_sided;                       // per local chunk: FSDP gathers one-sidedly
  int stage = 0, dp_index = 0;
};

// "2.weight" of virtual stage c -> the whole model's "<first layer of c + 2>.weight".
std::string whole_name(const std::string& chunk_name, const std::vector<int64_t>& balance, int64_t c) {
  int64_t first = 0;
  for (int64_t i = 0; i < c; ++i) first += balance[size_t(i)];
  const size_t dot = chunk_name.find('.');
  return std::to_string(first + std::stoll(chunk_name.substr(0, dot))) + chunk_name.substr(dot);
}

std::vector<RankResult> run(const Case& c, const Config& config, const std::shared_ptr<nn::Sequential>& start,
                            const std::vector<std::vector<Batch>>& data) {
  const int world = kPP * config.replicate * config.shard;
  std::vector<std::shared_ptr<nn::Sequential>> nets;  // every rank's own copy of the model
  for (int r = 0; r < world; ++r) nets.push_back(copy_of(start));
  std::vector<RankResult> results(static_cast<size_t>(world));
  auto errors = run_rank_threads(world, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    omp_set_num_threads(1);
    distributed::World w{.store = store, .rank = r, .size = world, .timeout = std::chrono::seconds(60)};
    auto tcp_group = [&](const std::vector<int>& ranks, const std::string&) -> std::shared_ptr<distributed::Communicator> {
      const auto me = std::find(ranks.begin(), ranks.end(), r);
      if (me == ranks.end()) return nullptr;
      std::string prefix = "tcp";
      for (int k : ranks) prefix += "-" + std::to_string(k);
      distributed::GlooOptions options;
      options.timeout = w.timeout;
      options.shared_memory = false;
      return std::make_shared<distributed::GlooCommunicator>(store, prefix, int(me - ranks.begin()), int(ranks.size()),
                                                             options);
    };
    const std::vector<int> shape = {kPP, config.replicate, config.shard};
    const std::vector<std::string> dims = {"pp", "dp_replicate", "dp_shard"};
    distributed::DeviceMesh mesh = config.shared_memory ? distributed::DeviceMesh("cpu", shape, dims, w)
                                                        : distributed::DeviceMesh("cpu", shape, dims, r, world, tcp_group);
    RankResult& out = results[static_cast<size_t>(r)];
    out.stage = mesh.local_rank("pp");
    out.dp_index = mesh.local_rank("dp_replicate") * config.shard + mesh.local_rank("dp_shard");
    PipelineStage stage(nets[static_cast<size_t>(r)], c.balance, mesh.group("pp"), Device("cpu"), kMicroBatches,
                        c.schedule, loss_of);
    for (const auto& chunk : stage.local_virtual_stages()) {
      int64_t n = 0;
      for (const Tensor& p : chunk->parameters()) n += p.numel();
      out.chunk_params.push_back(n);
    }
    parallel::pipeline::StageShards sharded;
    std::unique_ptr<optim::Optimizer> opt;
    if (config.mode == Mode::ZeRO1) {
      parallel::pipeline::replicate_stage(stage, mesh.group("dp_shard"));
      opt = std::make_unique<parallel::ZeroRedundancyOptimizer>(
          stage.parameters(), parallel::optimizer_class<optim::SGD>(kSGD), mesh.group("dp_shard"));
    } else {
      sharded = config.mode == Mode::HSDP
                    ? parallel::pipeline::shard_stage(stage, {mesh.group("dp_shard"), mesh.group("dp_replicate")},
                                                      config.options)
                    : parallel::pipeline::shard_stage(stage, mesh.group("dp_shard"), config.options);
      opt = std::make_unique<optim::SGD>(stage.parameters(), kSGD);
    }
    for (const auto& shards : data) {
      opt->zero_grad();
      const Batch& b = shards[static_cast<size_t>(out.dp_index)];
      stage.step(b.images, b.labels);
      opt->step();
    }
    // Between steps: counts, and what the rank holds.
    out.state_bytes = nn::model_state_bytes(stage, *opt);
    for (const Tensor& t : opt->state_tensors()) out.optimizer_elements += t.numel();
    for (const auto& chunk : stage.local_virtual_stages())
      for (const Tensor& p : chunk->parameters()) out.gathered_between_steps += p.numel();
    for (const auto& fsdp : sharded) {
      REQUIRE(fsdp);
      out.counts.push_back(fsdp->runtime().comm_counts());
      int64_t units = 0;
      for (const auto& unit : fsdp->units()) {
        if (!unit.flat) continue;
        ++units;
        out.expected_bytes += 3 * 8 * unit.flat->layout().shard_size;  // parameter, gradient, momentum
        CHECK(unit.flat->gathered_resident_bytes() == 0);
      }
      out.units.push_back(units);
      out.one_sided.push_back(fsdp->runtime().gathers_one_sided());
    }
    // The trained state, under the whole model's names.
    const auto chunks = stage.local_virtual_stages();
    for (size_t v = 0; v < chunks.size(); ++v) {
      const int64_t mc = parallel::pipeline::virtual_stage(out.stage, static_cast<int64_t>(v), kPP);
      const OrderedDict<Tensor> state =
          sharded.empty() ? chunks[v]->state_dict() : fsdp::full_state_dict(*sharded[v], /*rank0_only=*/false);
      for (const auto& [name, values] : values_of(state)) out.state[whole_name(name, c.balance, mc)] = values;
    }
  });
  require_no_errors(errors);
  return results;
}

std::vector<std::vector<Batch>> make_data(int replicas) {
  std::vector<std::vector<Batch>> data(kSteps);  // [step][data shard]
  for (auto& shards : data)
    for (int d = 0; d < replicas; ++d) shards.push_back({randn({8, 3, 8, 8}, kFloat64), randint(0, 10, {8})});
  return data;
}

// Every rank's chunks against the reference; every name on all of its replicas.
void check_transparent(const std::vector<RankResult>& results, const std::map<std::string, std::vector<double>>& want,
                       int replicas) {
  size_t compared = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    for (const auto& [key, got] : results[r].state) {
      const std::string& name = key;  // See Note [doctest messages name no structured binding]
      CAPTURE(r);
      CAPTURE(name);
      REQUIRE(want.count(name));
      const auto& expected = want.at(name);
      REQUIRE(got.size() == expected.size());
      double diff = 0;
      for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::abs(got[i] - expected[i]));
      CHECK(diff <= 1e-12);  // float64; the sums' order differs (reduce-scatter vs accumulation)
      ++compared;
    }
  }
  CHECK(compared == static_cast<size_t>(replicas) * want.size());  // every tensor on each of its replicas
}

}  // namespace

TEST_CASE("pp x FSDP: each stage's shards train as the in-process pipeline; one gather and one reduce-scatter per unit and step") {
  // Counted by FSDP itself (Runtime::comm_counts: every gather, collective or one-sided,
  // and every reduce-scatter its FlatParameters issue), per local chunk, over the steps.
  // With shared memory the gathers are one-sided copies and the ranks meet at a barrier
  // once per chunk and step; over TCP they are collective all_gathers, which every
  // replica must issue in the same order (the same schedule row: it does).
  for (bool shared_memory : {true, false})
  for (const Case& c : kCases) {
    for (bool reshard_after_forward : {false, true}) {
      CAPTURE(shared_memory);
      CAPTURE(c.schedule);
      CAPTURE(reshard_after_forward);
      manual_seed(21);
      auto start = bn_net();
      const auto data = make_data(2);
      const auto want = reference_state(c, copy_of(start), data);
      Config config{.shared_memory = shared_memory};
      if (reshard_after_forward) {
        // FULL_SHARD per micro-batch, over several units per chunk (Conv2d and Linear are
        // units of their own, the layers between them one more); no unit kept after its
        // forward, so that every forward and every backward gathers.
        config.options = {.auto_wrap_policy = {{"Conv2d", "Linear"}}, .keep_last_gathered = 0,
                          .reshard_after_forward = true};
      }
      const auto results = run(c, config, start, data);
      check_transparent(results, want, 2);
      for (const RankResult& r : results) {
        CAPTURE(r.stage);
        REQUIRE(r.counts.size() == r.units.size());
        for (size_t v = 0; v < r.counts.size(); ++v) {
          const auto& n = r.counts[v];
          const int64_t units = r.units[v];
          if (r.dp_index == 0)
            MESSAGE(c.schedule, std::string(reshard_after_forward ? ", reshard_after_forward" : ", default"),
                    std::string(shared_memory ? ", one-sided" : ", tcp"), ": stage ", r.stage, " chunk ", v, ", ",
                    units, " unit(s), ", kSteps, " steps of ", kMicroBatches, " micro-batches: ", n.all_gathers,
                    " gathers, ", n.reduce_scatters, " reduce-scatters, ", n.barriers, " barriers");
          CHECK(n.reduce_scatters == kSteps * units);  // once per unit and step, after the last backward
          CHECK(n.all_reduces == 0);
          CHECK(n.all_gathers == (reshard_after_forward ? 2 * kMicroBatches : 1) * kSteps * units);
          CHECK(r.one_sided[v] == shared_memory);
          CHECK(n.barriers == (shared_memory ? kSteps : 0));  // the step's first forward only
        }
        // Between steps a rank holds 1/N of its stage: the shards, their gradients and
        // momentum (8 bytes each, float64), each unit padded to a multiple of N.
        int64_t stage_params = 0, units = 0;
        for (int64_t n : r.chunk_params) stage_params += n;
        for (int64_t n : r.units) units += n;
        CHECK(r.gathered_between_steps == 0);
        CHECK(r.state_bytes == r.expected_bytes);
        CHECK(r.expected_bytes >= 3 * 8 * stage_params / 2);
        CHECK(r.expected_bytes <= 3 * 8 * (stage_params / 2 + units));
      }
    }
  }
}

TEST_CASE("pp x HSDP: 2 stages x 2 replicas x 2 shards (8 ranks) train as the in-process pipeline") {
  for (const Case& c : kCases) {
    CAPTURE(c.schedule);
    manual_seed(22);
    auto start = bn_net();
    const auto data = make_data(4);
    const auto want = reference_state(c, copy_of(start), data);
    const Config config{.mode = Mode::HSDP, .replicate = 2, .shard = 2,
                        .options = {.sharding_strategy = ShardingStrategy::HYBRID_SHARD}};
    const auto results = run(c, config, start, data);
    check_transparent(results, want, 4);
    for (const RankResult& r : results) {
      for (size_t v = 0; v < r.counts.size(); ++v) {
        CHECK(r.counts[v].all_gathers == kSteps * r.units[v]);
        CHECK(r.counts[v].reduce_scatters == kSteps * r.units[v]);
        CHECK(r.counts[v].all_reduces == kSteps * r.units[v]);  // across dp_replicate, after the reduce-scatter
      }
      CHECK(r.state_bytes == r.expected_bytes);
    }
  }
}

TEST_CASE("pp x ZeRO-1: a replicated stage with its optimizer state sharded trains as the in-process pipeline") {
  for (const Case& c : kCases) {
    CAPTURE(c.schedule);
    manual_seed(23);
    auto start = bn_net();
    const auto data = make_data(2);
    const auto want = reference_state(c, copy_of(start), data);
    const auto results = run(c, {.mode = Mode::ZeRO1}, start, data);
    check_transparent(results, want, 2);
    // Each replica keeps the momentum of its partition of its own stage's parameters:
    // together, one buffer per parameter of the stage, no more.
    for (int s = 0; s < kPP; ++s) {
      CAPTURE(s);
      int64_t stage_params = -1, momentum = 0;
      for (const RankResult& r : results) {
        if (r.stage != s) continue;
        int64_t n = 0;
        for (int64_t p : r.chunk_params) n += p;
        stage_params = n;
        CHECK(r.optimizer_elements < n);
        momentum += r.optimizer_elements;
      }
      CHECK(momentum == stage_params);
    }
  }
}
