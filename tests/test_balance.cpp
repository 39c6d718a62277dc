// Stage balance (parallel/balance.h, parallel/pipeline/pipeline_processes.h): the pure
// partition, the counted cost model (FlopCounterMode), the measured one, and the
// agreement of every rank of a pp × dp world on one balance.
//
// Note [Which tests depend on timing]
// balance_by_time measures, so its result may change with the machine's load; the tests
// here that use it never compare a measured balance with a fixed one. They check what must
// hold whatever the timings: that every rank ends with the one balance global rank 0
// measured, even where a rank's layers are slowed down on purpose (sleeps of 30 ms
// against 1 ms: a measurement noisy enough to reverse that would take a machine stalled
// for longer than the test's collectives wait).
#include <doctest/doctest.h>

#include <chrono>
#include <thread>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/cpu/kernel_benchmark.h"     // defines: backends::cpu::set_benchmark, KernelChoices
#include "core/flop_counter.h"              // defines: FlopCounterMode
#include "nn/nn.h"
#include "parallel/balance.h"               // defines: balance_by_cost, count_layer_costs, ...
#include "parallel/device_mesh.h"           // defines: DeviceMesh
#include "parallel/pipeline/pipeline_processes.h"  // defines: agree_on_balance, apply_pipeline_processes
#include "rank_threads.h"                   // defines: run_rank_threads, max_abs_diff

using namespace loom;
using loom::parallel::balance_by_cost;
using loom::testing::contains;
using loom::testing::max_abs_diff;

TEST_CASE("balance_by_cost: contiguous stages whose largest cost is smallest; earlier stages take fewer on ties") {
  CHECK(balance_by_cost({1, 1, 1, 1}, 2) == std::vector<int64_t>{2, 2});
  CHECK(balance_by_cost({5, 1, 1, 1, 1, 1}, 2) == std::vector<int64_t>{1, 5});
  CHECK(balance_by_cost({1, 2, 3, 4, 5}, 3) == std::vector<int64_t>{3, 1, 1});  // 6 | 4 | 5
  CHECK(balance_by_cost({1, 1, 1}, 2) == std::vector<int64_t>{1, 2});
  CHECK(balance_by_cost({0, 0, 7}, 3) == std::vector<int64_t>{1, 1, 1});
  CHECK(balance_by_cost({3, 1}, 1) == std::vector<int64_t>{2});
  CHECK_THROWS_WITH_AS(balance_by_cost({1}, 2), doctest::Contains("cannot cut 1 layers into 2"), Error);
  CHECK_THROWS_WITH_AS(balance_by_cost({1, -1}, 1), doctest::Contains(">= 0"), Error);
}

TEST_CASE("FlopCounterMode: 2·M·N·K per product and convolution, storage bytes, per thread, nested") {
  Tensor a = randn({4, 5}), b = randn({5, 6}), x = randn({2, 3, 8, 8});
  nn::Conv2d conv(3, 4, 3, /*stride=*/1, /*padding=*/1);
  nn::Linear fc(5, 6);
  FlopCounterMode outer;
  {
    FlopCounterMode inner;
    Tensor c = mm(a, b);
    CHECK(inner.total_flops() == 2 * 4 * 5 * 6);
    CHECK(inner.allocated_bytes() == 4 * 6 * 4);  // the float32 [4, 6] result
  }
  CHECK(outer.total_flops() == 0);  // the inner counter counted alone
  {
    FlopCounterMode inner;
    Tensor y = conv(x);  // [2, 4, 8, 8]: each output a dot product of 3·3·3 pairs
    CHECK(inner.total_flops() == 2 * (2 * 4 * 8 * 8) * (3 * 3 * 3));
  }
  {
    FlopCounterMode inner;
    Tensor y = fc(a);
    CHECK(inner.total_flops() == 2 * 4 * 5 * 6);
    Tensor z = bmm(randn({3, 4, 5}), randn({3, 5, 2}));
    CHECK(inner.total_flops() == 2 * 4 * 5 * 6 + 2 * 3 * 4 * 5 * 2);
  }
  CHECK(outer.total_flops() == 0);
  std::thread other([&] { Tensor c = mm(a, b); });  // another thread's work is not this one's
  other.join();
  CHECK(outer.total_flops() == 0);
  Tensor c = mm(a, b);  // the outer counter counts again once the inner ones have ended
  CHECK(outer.total_flops() == 2 * 4 * 5 * 6);
}

TEST_CASE("count_layer_costs: FLOPs, activation and parameter bytes per layer, scaled to the batch, module unchanged") {
  auto seq = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 8, 3, 1, 1, 1, 1, /*bias=*/false), std::make_shared<nn::BatchNorm2d>(8),
      std::make_shared<nn::ReLU>()});
  auto before = seq->state_dict();
  std::vector<Tensor> copies;
  for (const auto& [name, t] : before) copies.push_back(t.clone());
  const auto costs = parallel::count_layer_costs(*seq, zeros({5, 3, 16, 16}));
  REQUIRE(costs.size() == 3);
  CHECK(costs[0].flops == 5 * 2 * (8 * 16 * 16) * (3 * 3 * 3));
  CHECK(costs[0].parameter_bytes == 8 * 3 * 3 * 3 * 4);
  CHECK(costs[0].activation_bytes >= 5 * 8 * 16 * 16 * 4);  // its output, at least
  CHECK(costs[1].flops == 0);
  CHECK(costs[1].parameter_bytes == 2 * 8 * 4);
  CHECK(costs[2].activation_bytes == 5 * 8 * 16 * 16 * 4);  // ReLU writes its output, nothing else
  CHECK(costs[2].parameter_bytes == 0);
  CHECK(costs[0].cost() > costs[2].cost());
  size_t k = 0;
  for (const auto& [key, t] : seq->state_dict()) {  // BatchNorm's running statistics too
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    CHECK_MESSAGE(max_abs_diff(t.to(kFloat64), copies[k++].to(kFloat64)) == 0, name);
  }
  CHECK_THROWS_WITH_AS(parallel::count_layer_costs(*seq, zeros({0, 3, 16, 16})),
                       doctest::Contains("expected a sample batch of at least one example"), Error);
}

TEST_CASE("count_layer_costs counts with the fixed rules: the kernel search on, whatever its clock, counts alike") {
  // Note [Fixed rules where every rank must count alike]: with the search inside the count,
  // 4 ranks of --pp 2 --dp-shard 2 cut ResNet18 as 9,5 and 8,6 and refused to start.
  auto seq = nn::resnet18(10)->sequential();
  const Tensor sample = zeros({8, 3, 32, 32});
  const auto fixed = parallel::count_layer_costs(*seq, sample);
  struct SearchOn {
    SearchOn() { backends::cpu::set_benchmark(true); }
    ~SearchOn() {
      backends::cpu::set_benchmark(false);
      cpu::autotune::set_timing_adjustment_for_testing(nullptr);
    }
  } on;
  for (const char* slowed : {"onednn_winograd_blocked", "onednn_direct_blocked"}) {
    CAPTURE(slowed);
    backends::cpu::KernelChoices table;  // a fresh search each time, as on a new rank
    backends::cpu::ScopedKernelChoices scope(table);
    cpu::autotune::set_timing_adjustment_for_testing([slowed](const std::string& name, double seconds) {
      return name == slowed ? seconds * 100 : seconds;
    });
    const auto searched = parallel::count_layer_costs(*seq, sample);
    REQUIRE(searched.size() == fixed.size());
    for (size_t i = 0; i < fixed.size(); ++i) {
      CAPTURE(i);
      CHECK(searched[i].flops == fixed[i].flops);
      CHECK(searched[i].activation_bytes == fixed[i].activation_bytes);
      CHECK(searched[i].parameter_bytes == fixed[i].parameter_bytes);
    }
    CHECK(table.entries().empty());  // nothing was searched while counting
  }
}

TEST_CASE("balance_by_cost_model: ResNet18 cut the same way every time, under load too, and by work, not parameters") {
  auto seq = nn::resnet18(10)->sequential();  // conv1, bn1, relu, 8 blocks, avgpool, flatten, fc
  const Tensor sample = zeros({8, 3, 32, 32});
  const auto two = parallel::balance_by_cost_model(*seq, sample, 2);
  const auto four = parallel::balance_by_cost_model(*seq, sample, 4);
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;  // load on every core while counting again
  for (unsigned i = 0; i < std::max(2u, std::thread::hardware_concurrency()); ++i)
    busy.emplace_back([&] {
      volatile double sink = 0;
      while (!stop.load()) sink = sink + 1.0;
    });
  CHECK(parallel::balance_by_cost_model(*seq, sample, 2) == two);
  CHECK(parallel::balance_by_cost_model(*seq, sample, 4) == four);
  stop = true;
  for (auto& t : busy) t.join();
  MESSAGE("resnet18 by cost: ", parallel::balance_str(two), " and ", parallel::balance_str(four));
  // layer4 (blocks 9 and 10 of the Sequential) holds 75% of the parameters but about a
  // quarter of the work: a parameter-count balance would give it a stage of its own.
  REQUIRE(two.size() == 2);
  CHECK(two[1] >= 4);
  REQUIRE(four.size() == 4);
  CHECK(four[3] >= 3);
  // The stem's convolution has 3 input channels: few FLOPs but a full-resolution output,
  // which the bytes term prices (a FLOPs-only model would call conv1, bn1 and relu free).
  const auto costs = parallel::count_layer_costs(*seq, sample);
  CHECK(costs[1].flops == 0);
  CHECK(costs[1].cost() > 0.01 * costs[3].cost());
}

namespace {

// A layer that takes `ms` milliseconds: a rank's layers slowed down on purpose.
class Sleep : public nn::Module {
 public:
  explicit Sleep(int ms) : nn::Module("Sleep"), ms_(ms) {}
  Tensor forward(const Tensor& input) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    return input * 1.0;
  }

 private:
  int ms_;
};

// Four layers; on a slowed rank the first takes 30 ms instead of 1, which moves a measured
// two-stage cut from 2,2 to 1,3.
std::shared_ptr<nn::Sequential> sleepy_layers(bool slowed) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<Sleep>(slowed ? 30 : 1), std::make_shared<Sleep>(1), std::make_shared<Sleep>(1),
      std::make_shared<Sleep>(1)});
}

}  // namespace

TEST_CASE("balance_by_time on one rank: the slowed layer gets a stage of its own") {
  // 30 ms against three of 1 ms: no noise turns 30 | 3 into a better cut than 31 | 2.
  CHECK(parallel::balance_by_time(*sleepy_layers(true), zeros({2, 3}), 2, 2) == std::vector<int64_t>{1, 3});
}

// Under pp = 2 × dp = 2 (mesh [[0, 1], [2, 3]]: pipelines {0, 2} and {1, 3}) rank 1 is the
// first stage of the second pipeline, and its first layer is slow. Timed per pipeline,
// the second pipeline would cut 1,3 and the first (most likely) 2,2; timed once on global
// rank 0 and broadcast, every rank cuts as rank 0 measured. Which cut rank 0 measures
// depends on its timings (1 ms sleeps under load), so the test asks only that every rank
// holds the same one. Run through agree_on_balance and through apply_pipeline_processes,
// as the trainer does.
TEST_CASE("--balance time under pp x dp: global rank 0 measures, every rank cuts alike though rank 1 is slower") {
  constexpr int kWorld = 4;
  std::vector<std::shared_ptr<nn::Sequential>> nets;
  for (int r = 0; r < kWorld; ++r) nets.push_back(sleepy_layers(/*slowed=*/r == 1));
  std::vector<std::vector<int64_t>> agreed(kWorld), staged(kWorld);
  auto errors = loom::testing::run_rank_threads(kWorld, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    distributed::World w{.store = store, .rank = r, .size = kWorld, .timeout = std::chrono::seconds(30)};
    auto world = distributed::new_group(w, {0, 1, 2, 3}, "world");
    distributed::DeviceMesh mesh("cpu", {2, 2}, {"pp", "dp"}, w);
    auto& net = *nets[size_t(r)];
    agreed[size_t(r)] = parallel::pipeline::agree_on_balance(net, {}, "time", 2, zeros({2, 3}), *world);
    auto stage = parallel::pipeline::apply_pipeline_processes(
        nets[size_t(r)], mesh.group("pp"), Device("cpu"), {.balance = {}, .balance_by = "time", .n_microbatches = 1, .schedule = "gpipe"},
        [](const Tensor& out, const Tensor&) { return out.sum(); }, zeros({2, 3}), world);
    staged[size_t(r)] = stage->balance();
  });
  loom::testing::require_no_errors(errors);
  MESSAGE("rank 0 measured ", parallel::balance_str(agreed[0]), " then ", parallel::balance_str(staged[0]));
  for (int r = 1; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(agreed[size_t(r)] == agreed[0]);
    CHECK(staged[size_t(r)] == staged[0]);
  }
}

TEST_CASE("every rank's balance is checked against the world's: an error naming the ranks and their balances") {
  constexpr int kWorld = 3;
  const std::vector<std::vector<int64_t>> given = {{1, 3}, {2, 2}, {1, 3}};
  auto errors = loom::testing::run_ranks(kWorld, [&](std::shared_ptr<distributed::Communicator> comm) {
    auto net = sleepy_layers(false);
    (void)parallel::pipeline::agree_on_balance(*net, given[size_t(comm->rank())], "cost", 2, zeros({2, 3}), *comm);
  });
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    CHECK(contains(errors[size_t(r)], "the ranks cut the model into pipeline stages differently"));
    CHECK(contains(errors[size_t(r)], "ranks 0, 2: 1,3"));
    CHECK(contains(errors[size_t(r)], "ranks 1: 2,2"));
  }
  // Agreeing ranks pass, by cost too (every rank computes it alike).
  auto fine = loom::testing::run_ranks(kWorld, [&](std::shared_ptr<distributed::Communicator> comm) {
    auto net = nn::resnet_tiny(10)->sequential();
    (void)parallel::pipeline::agree_on_balance(*net, {}, "cost", 3, zeros({2, 3, 16, 16}), *comm);
  });
  loom::testing::require_no_errors(fine);
  auto bad = loom::testing::run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    auto net = sleepy_layers(false);
    (void)parallel::pipeline::agree_on_balance(*net, {}, "flops", 2, zeros({2, 3}), *comm);
  });
  for (const std::string& e : bad) CHECK(contains(e, "balance_by: expected \"cost\" (the cost model) or \"time\""));
}

TEST_CASE("balance_by_time: one count per stage covering every layer, and the module left as it was") {
  auto model = nn::resnet_tiny(10);
  auto seq = model->sequential();
  auto before = model->state_dict();
  std::vector<Tensor> copies;
  for (const auto& [name, t] : before) copies.push_back(t.clone());
  auto balance = parallel::balance_by_time(*seq, randn({4, 3, 16, 16}), 3, 1);
  REQUIRE(balance.size() == 3);
  int64_t total = 0;
  for (int64_t b : balance) {
    CHECK(b >= 1);
    total += b;
  }
  CHECK(total == static_cast<int64_t>(seq->size()));
  size_t k = 0;
  for (const auto& [key, t] : model->state_dict()) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    CHECK_MESSAGE(max_abs_diff(t.to(kFloat64), copies[k++].to(kFloat64)) == 0, name);
  }
  for (const Tensor& p : model->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("choose_balance: given counts checked; cost and time; anything else named") {
  auto seq = nn::resnet_tiny(10)->sequential();
  const auto n = static_cast<int64_t>(seq->size());
  const Tensor sample = zeros({2, 3, 16, 16});
  CHECK(parallel::choose_balance(*seq, {3, n - 3}, "cost", 2, sample) == std::vector<int64_t>{3, n - 3});
  CHECK_THROWS_WITH_AS(parallel::choose_balance(*seq, {3, n}, "cost", 2, sample),
                       doctest::Contains("adding up to the Sequential's length"), Error);
  CHECK(parallel::choose_balance(*seq, {}, "cost", 2, sample) == parallel::balance_by_cost_model(*seq, sample, 2));
  CHECK(parallel::choose_balance(*seq, {}, "time", 2, sample).size() == 2);
  CHECK_THROWS_WITH_AS(parallel::choose_balance(*seq, {}, "size", 2, sample),
                       doctest::Contains("balance_by: expected \"cost\" (the cost model) or \"time\" (measured), got 'size'"),
                       Error);
  CHECK_THROWS_WITH_AS(parallel::choose_balance(*seq, {}, "cost", n + 1, sample),
                       doctest::Contains("every stage needs at least one layer"), Error);
}

