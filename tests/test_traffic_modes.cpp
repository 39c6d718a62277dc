// Each parallel mode's communication per training step, counted by the communicator
// (parallel/comm/traffic.h) and set against the mode's formula (docs/communication.md):
// DDP, ZeRO-1, FSDP (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD; one-sided and collective
// gathers) and a pipeline's sends across a cut. Ranks are threads (tests/rank_threads.h).
//
// Ψ is the model's trainable parameter count; parameters are float32 (4 bytes), so a
// full copy of them is 4Ψ bytes. Counts do not depend on the machine: the checks are
// exact against the formula computed from what the mode really moves (DDP's buckets,
// FSDP's padded units), and within 5% of the formula computed from Ψ alone.
//
// The last test case prints docs/communication.md's table; for ResNet18 instead of the
// tiny ResNet: LOOM_TRAFFIC_MODEL=resnet18 build/tests/test_traffic_modes -tc='*table*'
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <string>

#include "autograd/ops.h"                               // defines: cross_entropy
#include "nn/nn.h"                                      // defines: resnet_tiny, resnet18
#include "nn/optim/sgd.h"                               // defines: optim::SGD
#include "parallel/comm/traffic.h"                      // defines: Traffic
#include "parallel/ddp/distributed_data_parallel.h"     // defines: DistributedDataParallel
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel
#include "parallel/pipeline/pipeline_stage.h"           // defines: PipelineStage
#include "parallel/zero_redundancy_optimizer.h"         // defines: ZeroRedundancyOptimizer
#include "rank_threads.h"                               // defines: run_ranks, run_rank_threads
#include "transparency.h"                               // defines: small_net

using namespace loom;
using namespace loom::testing;
using distributed::Communicator;
using distributed::Traffic;
using fsdp::ShardingStrategy;

namespace {

double all_reduce_formula(double s, int n) { return 2.0 * (n - 1) / n * s; }
double gather_formula(double s, int n) { return double(n - 1) / n * s; }
bool within(double measured, double formula, double relative) {
  return std::abs(measured - formula) <= relative * formula;
}

// Ψ with every parameter's dim 0 padded to a multiple of `world` (a 0-d parameter as [1]):
// what the per-parameter layout moves (Note [Per-parameter shards]).
int64_t per_parameter_padded_count(const nn::Module& model, int world) {
  int64_t count = 0;
  for (const Tensor& p : model.parameters()) {
    if (!p.requires_grad()) continue;
    const int64_t rows = p.dim() == 0 ? 1 : p.size(0);
    count += (rows + world - 1) / world * world * (p.numel() / std::max<int64_t>(rows, 1));
  }
  return count;
}

int64_t trainable_count(const nn::Module& model) {
  int64_t psi = 0;
  for (const Tensor& p : model.parameters())
    if (p.requires_grad()) psi += p.numel();
  return psi;
}

int64_t buffer_bytes(const nn::Module& model) {
  int64_t bytes = 0;
  for (const Tensor& b : model.buffers()) bytes += static_cast<int64_t>(b.nbytes());
  return bytes;
}

// One global batch: 4 images (8 x 8) per rank, each rank takes its own.
struct Batch {
  Tensor images, labels;
  explicit Batch(int world) : images(randn({4 * world, 3, 8, 8})), labels(randint(0, 10, {4 * world})) {}
  Tensor images_of(int rank) const { return images.narrow(0, 4 * rank, 4); }
  Tensor labels_of(int rank) const { return labels.narrow(0, 4 * rank, 4); }
};

void train_step(nn::Module& model, optim::Optimizer& opt, const Batch& batch, int rank) {
  Tensor loss = cross_entropy(model(batch.images_of(rank)), batch.labels_of(rank));
  opt.zero_grad();
  loss.backward();
  opt.step();
}

// Data-parallel modes move the same bytes on every rank: checked, and rank 0's returned.
Traffic same_on_every_rank(const std::vector<Traffic>& per_rank) {
  for (size_t r = 1; r < per_rank.size(); ++r) {
    CAPTURE(r);
    CHECK(per_rank[r].all_reduce.bytes == per_rank[0].all_reduce.bytes);
    CHECK(per_rank[r].all_gather.bytes == per_rank[0].all_gather.bytes);
    CHECK(per_rank[r].reduce_scatter.bytes == per_rank[0].reduce_scatter.bytes);
    CHECK(per_rank[r].broadcast.bytes == per_rank[0].broadcast.bytes);
  }
  return per_rank[0];
}

// One DDP step (with ZeRO-1's optimizer when `zero`): what it moved on rank 0. Counted
// from after construction: the first broadcast of the parameters is not a step's.
Traffic ddp_step(const std::shared_ptr<nn::Module>& start, int world, bool zero, double bucket_cap_mb = 25) {
  const Batch batch(world);
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  std::vector<Traffic> step(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    ddp::DistributedDataParallel ddp(replicas[comm->rank()], comm, {.bucket_cap_mb = bucket_cap_mb});
    std::unique_ptr<optim::Optimizer> opt;
    if (zero)
      opt = std::make_unique<parallel::ZeroRedundancyOptimizer>(
          ddp.parameters(), parallel::optimizer_class<optim::SGD>(optim::SGDOptions{.lr = 0.1}), comm);
    else
      opt = std::make_unique<optim::SGD>(ddp.parameters(), optim::SGDOptions{.lr = 0.1});
    comm->reset_traffic();
    train_step(ddp, *opt, batch, comm->rank());
    step[comm->rank()] = comm->traffic();
  }));
  return same_on_every_rank(step);
}

// One FSDP step, and what the count is checked against: the units' padded sizes.
struct FsdpStep {
  Traffic traffic;
  std::vector<int64_t> padded, totals;  // per unit with parameters
  bool one_sided = false;
  // Elements gathered: every unit once, the ones freed after forward (all but the last
  // keep_last_gathered, FULL_SHARD only; Note [Which units stay gathered]) twice.
  int64_t gathered_elements = 0, padded_sum = 0;
  int64_t freed_total = 0;  // parameters of the units gathered twice
};

FsdpStep fsdp_step(const std::shared_ptr<nn::Module>& start, int world, ShardingStrategy strategy,
                   int keep_last_gathered = 1, bool shm = true, bool per_parameter = false) {
  const Batch batch(world);
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  std::vector<Traffic> step(world);
  FsdpStep out;
  require_no_errors(run_ranks(
      world,
      [&](std::shared_ptr<Communicator> comm) {
        fsdp::FSDPOptions options;
        options.sharding_strategy = strategy;
        options.keep_last_gathered = keep_last_gathered;
        options.per_parameter_sharding = per_parameter;
        fsdp::FullyShardedDataParallel model(replicas[comm->rank()], comm, options);
        optim::SGD opt(model.parameters(), {.lr = 0.1});
        if (comm->rank() == 0) {
          for (const auto& unit : model.units())
            if (unit.flat) {
              out.padded.push_back(unit.flat->layout().padded);
              out.totals.push_back(unit.flat->layout().total);
            }
          out.one_sided = model.runtime().gathers_one_sided();
        }
        comm->reset_traffic();
        train_step(model, opt, batch, comm->rank());
        step[comm->rank()] = comm->traffic();
      },
      20s, shm));
  out.traffic = same_on_every_rank(step);
  const size_t units = out.padded.size();
  const size_t kept = strategy == ShardingStrategy::FULL_SHARD ? size_t(keep_last_gathered) : units;
  for (size_t u = 0; u < units; ++u) {
    const bool freed = u + kept < units;
    out.gathered_elements += out.padded[u] * (freed ? 2 : 1);
    out.freed_total += freed ? out.totals[u] : 0;
    out.padded_sum += out.padded[u];
  }
  return out;
}

// One HYBRID_SHARD step on 4 ranks as 2 replicas x 2 shards (row-major, as DeviceMesh
// lays out [replicate, shard]: ranks {0, 1} and {2, 3} are replicas): what each group moved.
struct HsdpStep {
  Traffic in_shard, across;  // the shard group's, the replicate group's
  int64_t units = 0, gathered_elements = 0, padded_sum = 0, freed_total = 0;  // as FsdpStep
};

HsdpStep hsdp_step(const std::shared_ptr<nn::Module>& start) {
  constexpr int kWorld = 4, S = 2, R = 2;
  const Batch batch(kWorld);
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < kWorld; ++r) replicas.push_back(start->clone());
  std::vector<Traffic> in_shard(kWorld), across(kWorld);
  std::vector<int64_t> padded, totals;
  require_no_errors(run_rank_threads(kWorld, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    omp_set_num_threads(1);
    distributed::GlooOptions options;
    options.timeout = 20s;
    auto shard = std::make_shared<distributed::GlooCommunicator>(store, "shard" + std::to_string(r / S), r % S, S,
                                                                 options);
    auto replicate = std::make_shared<distributed::GlooCommunicator>(store, "replicate" + std::to_string(r % S),
                                                                     r / S, R, options);
    fsdp::FSDPOptions fsdp_options;
    fsdp_options.sharding_strategy = ShardingStrategy::HYBRID_SHARD;
    fsdp::FullyShardedDataParallel model(replicas[r], std::pair{shard, replicate}, fsdp_options);
    optim::SGD opt(model.parameters(), {.lr = 0.1});
    if (r == 0)
      for (const auto& unit : model.units())
        if (unit.flat) {
          padded.push_back(unit.flat->layout().padded);
          totals.push_back(unit.flat->layout().total);
        }
    shard->reset_traffic();
    replicate->reset_traffic();
    train_step(model, opt, batch, r);
    in_shard[r] = shard->traffic();
    across[r] = replicate->traffic();
  }));
  HsdpStep out{same_on_every_rank(in_shard), same_on_every_rank(across)};
  out.units = int64_t(padded.size());
  for (size_t u = 0; u < padded.size(); ++u) {
    const bool kept = u + 1 == padded.size();  // keep_last_gathered = 1
    out.gathered_elements += padded[u] * (kept ? 1 : 2);
    out.freed_total += kept ? 0 : totals[u];
    out.padded_sum += padded[u];
  }
  return out;
}

}  // namespace

TEST_CASE("DDP, one step of resnet_tiny: all_reduce moves 2(N-1)/N * 4Ψ bytes per rank; buffers go by broadcast") {
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    manual_seed(1);
    auto start = nn::resnet_tiny(10);
    const double psi = double(trainable_count(*start));
    // Small buckets, so that several all_reduces (each rounded) make up the step.
    const Traffic t = ddp_step(start, world, /*zero=*/false, /*bucket_cap_mb=*/0.1);
    const double formula = all_reduce_formula(4 * psi, world);
    CHECK(t.all_reduce.calls >= 3);
    CHECK(t.all_reduce.payload_bytes == int64_t(4 * psi));  // every gradient once: buckets are not padded
    CHECK(std::abs(t.all_reduce.bytes - formula) <= 0.5 * t.all_reduce.calls);
    CHECK(within(t.all_reduce.bytes, formula, 0.05));
    CHECK(t.broadcast.bytes == buffer_bytes(*start));  // BatchNorm's statistics, from rank 0, before the forward
    CHECK(t.all_gather.calls + t.reduce_scatter.calls + t.send.calls + t.recv.calls == 0);
  }
}

TEST_CASE("DDP + ZeRO-1, one step: DDP's all_reduce, then every parameter broadcast from its owner (S = 4Ψ per rank)") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    manual_seed(2);
    auto start = nn::resnet_tiny(10);
    const double psi = double(trainable_count(*start));
    const Traffic t = ddp_step(start, world, /*zero=*/true);
    CHECK(std::abs(t.all_reduce.bytes - all_reduce_formula(4 * psi, world)) <= 0.5 * t.all_reduce.calls);
    // A broadcast counts S on every rank (the root sends it, the others receive it).
    CHECK(t.broadcast.bytes == int64_t(4 * psi) + buffer_bytes(*start));
  }
}

// Shared memory gathers one-sidedly (Note [One-sided all_gather]), TCP by collectives:
// the same counts.
TEST_CASE("FSDP, one step of resnet_tiny: all_gather per forward (and backward where freed), reduce_scatter once") {
  struct Case {
    ShardingStrategy strategy;
    int keep_last_gathered, world;
    bool shm;
    bool per_parameter = false;  // fully_shard's layout (Note [Per-parameter shards]): the same formula
  };
  for (Case c : {Case{ShardingStrategy::FULL_SHARD, 1, 2, true}, Case{ShardingStrategy::FULL_SHARD, 1, 3, true},
                 Case{ShardingStrategy::FULL_SHARD, 1, 3, false}, Case{ShardingStrategy::FULL_SHARD, 0, 3, true},
                 Case{ShardingStrategy::FULL_SHARD, 2, 4, true}, Case{ShardingStrategy::SHARD_GRAD_OP, 1, 3, true},
                 Case{ShardingStrategy::SHARD_GRAD_OP, 1, 4, false}, Case{ShardingStrategy::FULL_SHARD, 1, 3, true, true},
                 Case{ShardingStrategy::FULL_SHARD, 0, 4, false, true},
                 Case{ShardingStrategy::SHARD_GRAD_OP, 1, 3, true, true}}) {
    const std::string strategy = fsdp::strategy_name(c.strategy);
    CAPTURE(strategy);
    CAPTURE(c.keep_last_gathered);
    CAPTURE(c.world);
    CAPTURE(c.shm);
    CAPTURE(c.per_parameter);
    const int n = c.world;
    manual_seed(3);
    auto start = nn::resnet_tiny(10);
    const double psi = double(trainable_count(*start));
    const FsdpStep s = fsdp_step(start, n, c.strategy, c.keep_last_gathered, c.shm, c.per_parameter);
    const Traffic& t = s.traffic;
    CHECK(s.one_sided == c.shm);
    const int64_t units = int64_t(s.padded.size());
    const size_t kept = c.strategy == ShardingStrategy::FULL_SHARD ? size_t(c.keep_last_gathered) : s.padded.size();
    CHECK(t.all_gather.calls == units + std::max<int64_t>(0, units - int64_t(kept)));
    CHECK(t.all_gather.bytes == (n - 1) * 4 * s.gathered_elements / n);
    CHECK(t.reduce_scatter.calls == units);
    CHECK(t.reduce_scatter.bytes == (n - 1) * 4 * s.padded_sum / n);
    // From Ψ. The flat layout pads under N elements per unit: within 1%. The per-parameter
    // one pads each parameter's dim 0 to a multiple of N (torch.chunk's rows, as FSDP2):
    // Ψ' = Σ ceil(d0 / N)·N·row, which at N = 3 on resnet_tiny's 8- and 16-channel
    // layers is several percent above Ψ, and at N = 2 or 4 is Ψ itself.
    const double moved = c.per_parameter ? double(per_parameter_padded_count(*start, n)) : psi;
    const std::string layout = c.per_parameter ? "per-parameter" : "flat";
    MESSAGE(strategy, " N=", n, " ", layout, ": padded Ψ / Ψ = ", moved / psi);
    CHECK(within(t.reduce_scatter.bytes, gather_formula(4 * moved, n), 0.01));
    if (!c.per_parameter) CHECK(within(t.all_gather.bytes, gather_formula(4 * (psi + double(s.freed_total)), n), 0.01));
    if (c.strategy == ShardingStrategy::FULL_SHARD && c.keep_last_gathered == 0)
      CHECK(within(t.all_gather.bytes, 2 * gather_formula(4 * psi, n), 0.05));
    if (c.strategy == ShardingStrategy::SHARD_GRAD_OP) CHECK(within(t.all_gather.bytes, gather_formula(4 * psi, n), 0.05));
    CHECK(t.all_reduce.calls == 0);
    CHECK(t.broadcast.bytes == buffer_bytes(*start));
  }
}

// HYBRID_SHARD over 4 ranks as 2 replicas x 2 shards: FULL_SHARD's traffic within each
// pair of shards, and each unit's reduced gradient shard all-reduced across the replicas.
TEST_CASE("FSDP HYBRID_SHARD 2 x 2, one step: FULL_SHARD's bytes within the shard group, 2(R-1)/R * 4Ψ/S across replicas") {
  constexpr int S = 2, R = 2;
  manual_seed(6);
  auto start = nn::resnet_tiny(10);
  const double psi = double(trainable_count(*start));
  const HsdpStep h = hsdp_step(start);
  const Traffic &t = h.in_shard, &x = h.across;
  CHECK(t.all_gather.bytes == (S - 1) * 4 * h.gathered_elements / S);
  CHECK(t.reduce_scatter.bytes == (S - 1) * 4 * h.padded_sum / S);
  CHECK(t.all_reduce.calls == 0);
  CHECK(x.all_reduce.calls == h.units);
  CHECK(x.all_reduce.payload_bytes == 4 * h.padded_sum / S);  // each unit's gradient shard
  CHECK(std::abs(x.all_reduce.bytes - all_reduce_formula(4.0 * h.padded_sum / S, R)) <= 0.5 * x.all_reduce.calls);
  CHECK(x.all_gather.calls + x.reduce_scatter.calls == 0);
  CHECK(within(t.all_gather.bytes, gather_formula(4 * (psi + double(h.freed_total)), S), 0.05));
  CHECK(within(t.reduce_scatter.bytes, gather_formula(4 * psi, S), 0.05));
  CHECK(within(x.all_reduce.bytes, all_reduce_formula(4 * psi / S, R), 0.05));
  // Buffers go from world rank 0 over both groups.
  CHECK(t.broadcast.bytes == buffer_bytes(*start));
  CHECK(x.broadcast.bytes == buffer_bytes(*start));
}

// small_net cut after its first ReLU: the cut carries [B, 6, 8, 8] float64 activations
// forward and their gradients back, whatever the number of micro-batches or the schedule.
TEST_CASE("pipeline, one step over 2 stages: each cut sends the batch's activations forward and gradients back") {
  for (const auto& run : {std::pair<std::string, int64_t>{"gpipe", 4}, {"1f1b", 2}, {"1f1b", 8}}) {
    // Named copies, not a structured binding: Note [doctest messages name no structured binding].
    const std::string schedule = run.first;
    const int64_t chunks = run.second;
    CAPTURE(schedule);
    CAPTURE(chunks);
    manual_seed(4);
    auto start = small_net();
    constexpr int64_t kBatch = 8;
    const Tensor images = randn({kBatch, 3, 8, 8}, kFloat64), labels = randint(0, 10, {kBatch});
    std::vector<std::shared_ptr<nn::Sequential>> nets;
    for (int r = 0; r < 2; ++r) nets.push_back(std::dynamic_pointer_cast<nn::Sequential>(start->clone()));
    std::vector<Traffic> step(2);
    require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      parallel::pipeline::PipelineStage stage(nets[r], {2, 4}, comm, Device("cpu"), chunks, schedule,
                                              [](const Tensor& out, const Tensor& y) { return cross_entropy(out, y); });
      stage.step(images, labels);  // the first step agrees on shapes
      comm->reset_traffic();
      stage.step(images, labels);
      step[r] = comm->traffic();
    }));
    const int64_t cut_bytes = kBatch * 6 * 8 * 8 * 8;  // the batch's activations at the cut
    CHECK(step[0].send.bytes == cut_bytes);             // activations forward
    CHECK(step[0].recv.bytes == cut_bytes);             // their gradients back
    CHECK(step[1].recv.bytes == cut_bytes);
    CHECK(step[1].send.bytes == cut_bytes);
    CHECK(step[0].send.calls == chunks);  // one message per micro-batch and direction
    MESSAGE("pipeline ", schedule, " chunks=", chunks, ": rank 0 ", step[0].str(), " | rank 1 ", step[1].str());
  }
}

namespace {

// "312,008", "+6"
std::string thousands(double value, bool sign = false) {
  const long long rounded = std::llround(value);
  std::string digits = std::to_string(std::llabs(rounded)), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (rounded < 0 ? "-" : sign ? "+" : "") + out;
}

// One line of the table, checked: the count within 5% of the formula from Ψ.
std::string row(const char* mode, int n, const char* kind, const char* formula_text, double formula, int64_t measured) {
  CHECK(within(double(measured), formula, 0.05));
  char line[256];
  std::snprintf(line, sizeof line, "| %s | %d | %s | %s | %s | %s | %s |\n", mode, n, kind, formula_text,
                thousands(formula).c_str(), thousands(double(measured)).c_str(),
                thousands(double(measured) - std::round(formula), true).c_str());
  return line;
}

}  // namespace

// docs/communication.md's table: bytes per rank in one training step, the formula from Ψ
// against the count, N = 2 and 4. LOOM_TRAFFIC_MODEL=resnet18 for ResNet18.
TEST_CASE("the table of docs/communication.md: each mode's bytes per step, formula against count") {
  const char* env = std::getenv("LOOM_TRAFFIC_MODEL");
  const std::string model = env ? env : "resnet_tiny";
  REQUIRE((model == "resnet_tiny" || model == "resnet18"));
  manual_seed(5);
  std::shared_ptr<nn::Module> start = model == "resnet18" ? nn::resnet18(10) : nn::resnet_tiny(10);
  const double psi = double(trainable_count(*start));
  const int64_t buffers = buffer_bytes(*start);
  std::string table;
  double freed = 0;  // Ψ_freed: the same units at every N
  for (int n : {2, 4}) {
    const Traffic ddp = ddp_step(start, n, /*zero=*/false);
    table += row("DDP", n, "all_reduce", "2(N-1)/N · 4Ψ", all_reduce_formula(4 * psi, n), ddp.all_reduce.bytes);
    table += row("DDP", n, "broadcast", "buffers", double(buffers), ddp.broadcast.bytes);
    const Traffic zero = ddp_step(start, n, /*zero=*/true);
    table += row("ZeRO-1", n, "all_reduce", "2(N-1)/N · 4Ψ", all_reduce_formula(4 * psi, n), zero.all_reduce.bytes);
    table += row("ZeRO-1", n, "broadcast", "4Ψ + buffers", 4 * psi + double(buffers), zero.broadcast.bytes);
    const FsdpStep full = fsdp_step(start, n, ShardingStrategy::FULL_SHARD);
    freed = double(full.freed_total);
    table += row("FSDP FULL_SHARD", n, "all_gather", "(N-1)/N · 4(Ψ + Ψ_freed)", gather_formula(4 * (psi + freed), n),
                 full.traffic.all_gather.bytes);
    table += row("FSDP FULL_SHARD", n, "reduce_scatter", "(N-1)/N · 4Ψ", gather_formula(4 * psi, n),
                 full.traffic.reduce_scatter.bytes);
    const FsdpStep grad_op = fsdp_step(start, n, ShardingStrategy::SHARD_GRAD_OP);
    table += row("FSDP SHARD_GRAD_OP", n, "all_gather", "(N-1)/N · 4Ψ", gather_formula(4 * psi, n),
                 grad_op.traffic.all_gather.bytes);
    table += row("FSDP SHARD_GRAD_OP", n, "reduce_scatter", "(N-1)/N · 4Ψ", gather_formula(4 * psi, n),
                 grad_op.traffic.reduce_scatter.bytes);  }
  // HYBRID_SHARD on the 4 ranks as 2 replicas (R) x 2 shards (S).
  const HsdpStep h = hsdp_step(start);
  table += row("FSDP HYBRID_SHARD 2 × 2", 4, "all_gather (shard group)", "(S-1)/S · 4(Ψ + Ψ_freed)",
               gather_formula(4 * (psi + freed), 2), h.in_shard.all_gather.bytes);
  table += row("FSDP HYBRID_SHARD 2 × 2", 4, "reduce_scatter (shard group)", "(S-1)/S · 4Ψ", gather_formula(4 * psi, 2),
               h.in_shard.reduce_scatter.bytes);
  table += row("FSDP HYBRID_SHARD 2 × 2", 4, "all_reduce (replicate group)", "2(R-1)/R · 4Ψ/S",
               all_reduce_formula(4 * psi / 2, 2), h.across.all_reduce.bytes);
  std::printf("\n%s: Ψ = %s float32 parameters (4Ψ = %s bytes), Ψ_freed = %s (FULL_SHARD's units but the last), "
              "buffers %s bytes\n\n",
              model.c_str(), thousands(psi).c_str(), thousands(4 * psi).c_str(), thousands(freed).c_str(),
              thousands(double(buffers)).c_str());
  std::printf("| mode | N | collective | formula | formula (bytes) | measured (bytes) | measured − formula |\n");
  std::printf("|---|---|---|---|---|---|---|\n%s\n", table.c_str());
}
