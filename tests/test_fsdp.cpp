// FullyShardedDataParallel. Ranks are threads (tests/rank_threads.h), each with its own
// gloo communicator(s).
//
// The contract is the transparency test: after a few SGD steps (momentum, weight decay),
// every sharding strategy ends with the weights DDP ends with on the same data.
#include <doctest/doctest.h>

#include <map>
#include <thread>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/trace.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "nn/safetensors.h"
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/fsdp/state_dict.h"
#include "parallel/sync_batch_norm.h"
#include "fsdp_harness.h"   // defines: Batches, sgd_steps, ddp_reference, fsdp_run, max_state_diff
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

TEST_CASE("transparency: FULL_SHARD, SHARD_GRAD_OP and NO_SHARD end with DDP's weights (small net, float64)") {
  manual_seed(3);
  // The same per-element arithmetic as DDP (scale by 1/N on the way in, sum, the same SGD
  // kernel): equal bits.
  check_every_strategy_equals_ddp(small_net(), {.auto_wrap_policy = kSmallNetPolicy}, "small net");
}

TEST_CASE("transparency: ResNet (tiny, BatchNorm, float32) under every strategy ends with DDP's weights and buffers") {
  manual_seed(4);
  auto start = nn::resnet_tiny(10, 4);
  const int world = 3;
  const Batches data = make_batches(3, 2 * world, kFloat32);
  const auto reference = ddp_reference(start, data, world);
  // Equal bits too: FSDP runs the stem unfused (conv1, bn1, relu as stages) where
  // ResNet::forward fuses bn1 and relu, and the fused epilogue computes the same values.
  check_strategies_against(reference, start, data, world,
                           {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD},
                           {}, "resnet_tiny");
  // Which units stay gathered from forward to backward changes only when they are
  // gathered, never the values (Note [Which units stay gathered]).
  for (int keep : {0, 2, 100}) {
    CAPTURE(keep);
    auto states = fsdp_run(start, data, world, {.sharding_strategy = ShardingStrategy::FULL_SHARD,
                                                .keep_last_gathered = keep});
    for (int r = 0; r < world; ++r) CHECK(max_state_diff(states[r], reference[r]) == 0.0);
  }
}

TEST_CASE("transparency: HYBRID_SHARD on 4 ranks as 2 replicas x 2 shards ends with DDP's weights") {
  manual_seed(5);
  const int world = 4;
  for (bool resnet : {false, true}) {
    CAPTURE(resnet);
    // float64: the sums run in another order than DDP's (Note below), and BatchNorm over
    // two samples per rank amplifies float32's rounding to 1e-3 within 3 steps.
    std::shared_ptr<nn::Module> start = resnet ? std::shared_ptr<nn::Module>(nn::resnet_tiny(10, 4)) : small_net();
    start->to(kFloat64);
    const Batches data = make_batches(3, 2 * world, kFloat64);
    const auto reference = ddp_reference(start, data, world);
    std::vector<std::shared_ptr<nn::Module>> replicas;
    for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
    std::vector<OrderedDict<Tensor>> states(world);
    require_no_errors(run_rank_threads(world, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
      FSDPOptions fsdp_options{.sharding_strategy = ShardingStrategy::HYBRID_SHARD};
      if (!resnet) fsdp_options.auto_wrap_policy = kSmallNetPolicy;
      FullyShardedDataParallel fsdp(replicas[r], hybrid_2x2_groups(r, store), fsdp_options);
      sgd_steps(fsdp, fsdp.parameters(), data, r, world);
      states[r] = full_state_dict(fsdp, /*rank0_only=*/false);
    }));
    // Sums in another order (within the pair, then across the pairs) than DDP's 4-way
    // sum; BatchNorm's tiny batches amplify the rounding (1e-12 for resnet_tiny).
    check_equals_reference(states, reference, std::string(resnet ? "resnet_tiny" : "small net") + " HYBRID_SHARD 2x2",
                           resnet ? 1e-10 : 1e-15);
  }
}

TEST_CASE("HYBRID_SHARD: groups that do not form a grid, and a shard group size that does not divide the world") {
  CHECK_THROWS_WITH_AS(replicas_for(4, 3), doctest::Contains("shard group size (3) must divide the world size (4)"),
                       Error);
  CHECK(replicas_for(6, 3) == 2);
  std::vector<std::shared_ptr<nn::Module>> models;
  for (int r = 0; r < 4; ++r) models.push_back(small_net());
  auto errors = run_rank_threads(4, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    distributed::GlooOptions options;
    options.timeout = std::chrono::seconds(20);
    auto shard = std::make_shared<distributed::GlooCommunicator>(store, "shard" + std::to_string(r / 2), r % 2, 2,
                                                                 options);
    // Wrong: {0, 3} and {1, 2} join ranks that hold different shards.
    const int group = (r == 0 || r == 3) ? 0 : 1;
    const int rank_in = (r == 0 || r == 1) ? 0 : 1;
    auto replicate = std::make_shared<distributed::GlooCommunicator>(store, "replicate" + std::to_string(group),
                                                                     rank_in, 2, options);
    FullyShardedDataParallel fsdp(models[r], std::pair{shard, replicate},
                                  {.sharding_strategy = ShardingStrategy::HYBRID_SHARD});
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(contains(errors[r], "inconsistent groups"));
    CHECK(contains(errors[r], "must join the ranks that hold the same shard"));
  }
  require_no_errors(run_ranks(1, [&](std::shared_ptr<Communicator> comm) {
    CHECK_THROWS_WITH_AS(FullyShardedDataParallel(small_net(), comm, {.sharding_strategy = ShardingStrategy::HYBRID_SHARD}),
                         doctest::Contains("needs two groups"), Error);
  }));
}

TEST_CASE("an optimizer over the unsharded module's parameters is an error at the third forward") {
  const Batches data = make_batches(3, 4, kFloat64);
  std::vector<std::shared_ptr<nn::Module>> models = {small_net(), small_net()};
  auto errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    FullyShardedDataParallel fsdp(models[r], comm, {.auto_wrap_policy = kSmallNetPolicy});
    sgd_steps(fsdp, models[r]->parameters(), data, r, 2);  // wrong: not fsdp.parameters()
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(contains(errors[r], "the last 2 backwards reduced gradients into the sharded parameters, but no optimizer"));
    CHECK(contains(errors[r], "optim::SGD(fsdp.parameters(), ...)"));
  }
  // The right optimizer whose first step is skipped (as a GradScaler skips an overflow): fine.
  // New models: the old ones' values stayed in their FSDPs' shards, and say so.
  require_no_errors(run_ranks(1, [&](std::shared_ptr<Communicator> comm) {
    CHECK_THROWS_WITH_AS(FullyShardedDataParallel(models[0], comm), doctest::Contains("wrapped by an FSDP before"),
                         Error);
  }));
  models = {small_net(), small_net()};
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    FullyShardedDataParallel fsdp(models[r], comm, {.auto_wrap_policy = kSmallNetPolicy});
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
    for (size_t s = 0; s < data.images.size(); ++s) {
      Tensor loss = cross_entropy(fsdp(shard(data.images[s], r, 2)), shard(data.labels[s], r, 2));
      opt.zero_grad();
      loss.backward();
      if (s > 0) opt.step();
    }
  }));
}

TEST_CASE("no_sync accumulates full gradients locally; the next backward reduces the sum (equals DDP's no_sync)") {
  manual_seed(6);
  auto start = small_net();
  const Batches data = make_batches(2, 4, kFloat64);
  auto accumulate = [&](nn::Module& model, auto&& no_sync, const std::vector<Tensor>& params, int r) {
    optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9});
    {
      auto guard = no_sync();
      cross_entropy(model(shard(data.images[0], r, 2)), shard(data.labels[0], r, 2)).backward();
    }
    cross_entropy(model(shard(data.images[1], r, 2)), shard(data.labels[1], r, 2)).backward();
    opt.step();
  };
  std::vector<std::shared_ptr<nn::Module>> ddp_models = {start->clone(), start->clone()};
  std::vector<std::shared_ptr<nn::Module>> fsdp_models = {start->clone(), start->clone()};
  std::vector<OrderedDict<Tensor>> states(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    ddp::DistributedDataParallel ddp(ddp_models[r], comm);
    accumulate(ddp, [&] { return ddp.no_sync(); }, ddp.parameters(), r);
    FullyShardedDataParallel fsdp(fsdp_models[r], comm, {.auto_wrap_policy = kSmallNetPolicy});
    accumulate(fsdp, [&] { return fsdp.no_sync(); }, fsdp.parameters(), r);
    states[r] = full_state_dict(fsdp, false);
  }));
  CHECK(max_state_diff(states[0], ddp_models[0]->state_dict()) == 0.0);
}

TEST_CASE("a parameter shared by two units is an error naming it and both units") {
  auto a = std::make_shared<nn::Linear>(4, 4), b = std::make_shared<nn::Linear>(4, 4);
  b->weight = b->register_parameter("weight", a->weight);  // tied
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{a, std::make_shared<nn::ReLU>(), b});
  require_no_errors(run_ranks(1, [&](std::shared_ptr<Communicator> comm) {
    CHECK_THROWS_WITH_AS(FullyShardedDataParallel(net, comm, {.auto_wrap_policy = {{"Linear"}}}),
                         doctest::Contains("parameter \"0.weight\" is used by two units, Linear 0 and Linear 2"),
                         Error);
    FullyShardedDataParallel one_unit(net, comm);  // the default policy: one unit holds both, one slot
    CHECK(one_unit.units().size() == 1);
  }));
}

TEST_CASE("memory: after a FULL_SHARD step a rank holds 1/N of the parameters and gradients, nothing gathered") {
  // Both layouts: the per-parameter one's local shards are its rows only (no padding).
  for (const bool per_parameter : {false, true}) {
    CAPTURE(per_parameter);
    auto model = nn::resnet_tiny(10, 8);
    int64_t full = 0;
    for (const Tensor& p : model->parameters()) full += p.numel();
    std::vector<std::shared_ptr<nn::Module>> models = {model, model->clone()};
    const Batches data = make_batches(1, 4, kFloat32);
    std::vector<int64_t> resident(2), gathered(2);
    require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      FullyShardedDataParallel fsdp(models[r], comm, {.per_parameter_sharding = per_parameter});
      sgd_steps(fsdp, fsdp.parameters(), data, r, 2);
      for (const Tensor& p : models[r]->parameters()) {
        gathered[r] += p.numel();
        CHECK_FALSE(p.grad().defined());  // full gradients are dropped after the reduce-scatter
      }
      for (const Tensor& s : fsdp.parameters()) resident[r] += s.numel() + s.grad().numel();
    }));
    for (int r = 0; r < 2; ++r) {
      CHECK(gathered[r] == 0);
      const double ratio = static_cast<double>(resident[r]) / static_cast<double>(2 * full);
      MESSAGE("rank ", r, ": resident parameters + gradients = ", resident[r], " of ", 2 * full, " (", ratio, ")");
      CHECK(ratio == doctest::Approx(0.5).epsilon(0.01));  // padding: at most one element per unit
    }
    if (per_parameter) CHECK(resident[0] + resident[1] == 2 * full);  // every row on exactly one rank
  }
}

TEST_CASE("checkpoints: full_state_dict has the single-process names; it loads into a plain model and into FSDP") {
  manual_seed(7);
  auto start = nn::resnet_tiny(10, 4);
  const int world = 3;
  const Batches data = make_batches(2, 2 * world, kFloat32);
  const auto reference = ddp_reference(start, data, world);
  const std::string path = "/tmp/loom_test_fsdp_" + std::to_string(::getpid()) + ".safetensors";
  std::vector<std::shared_ptr<nn::Module>> replicas, fresh;
  for (int r = 0; r < world; ++r) {
    replicas.push_back(start->clone());
    fresh.push_back(nn::resnet_tiny(10, 4));  // another initialisation
  }
  std::vector<size_t> sizes(world);
  std::vector<OrderedDict<Tensor>> reloaded(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    FullyShardedDataParallel fsdp(replicas[r], comm);
    sgd_steps(fsdp, fsdp.parameters(), data, r, world);
    sizes[r] = full_state_dict(fsdp).size();  // rank0_only
    save_full_state_dict(fsdp, path);
    comm->barrier()->wait();
    FullyShardedDataParallel other(fresh[r], comm, {.sharding_strategy = ShardingStrategy::SHARD_GRAD_OP});
    load_full_state_dict(other, safetensors::load_file(path));
    reloaded[r] = full_state_dict(other, false);
    // Bad input: a key missing, a key too many.
    auto state = safetensors::load_file(path);
    OrderedDict<Tensor> missing, extra = state;
    for (const auto& [k, v] : state)
      if (k != "fc.bias") missing.insert(k, v);
    extra.insert("module.fc.bias", *state.find("fc.bias"));
    CHECK_THROWS_WITH_AS(load_full_state_dict(other, missing), doctest::Contains("Missing keys: fc.bias."), Error);
    CHECK_THROWS_WITH_AS(load_full_state_dict(other, extra), doctest::Contains("Unexpected keys: module.fc.bias."),
                         Error);
  }));
  CHECK(sizes[0] == reference[0].size());
  CHECK(sizes[1] == 0);
  auto plain = nn::resnet_tiny(10, 4);
  nn::load(*plain, path);  // strict: the same names a single-process run writes
  CHECK(max_state_diff(plain->state_dict(), reference[0]) == 0.0);
  for (int r = 0; r < world; ++r) CHECK(max_state_diff(reloaded[r], reference[0]) == 0.0);
  std::remove(path.c_str());
}

TEST_CASE("SyncBatchNorm inside FSDP: the same weights and statistics as SyncBatchNorm inside DDP") {
  manual_seed(8);
  auto start = nn::resnet_tiny(10, 4);
  const int world = 2;
  const Batches data = make_batches(2, 2 * world, kFloat32);
  std::vector<std::shared_ptr<nn::Module>> ddp_models, fsdp_models;
  for (int r = 0; r < world; ++r) {
    ddp_models.push_back(start->clone());
    fsdp_models.push_back(start->clone());
  }
  std::vector<OrderedDict<Tensor>> states(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    nn::convert_sync_batchnorm_in_place(*ddp_models[r], comm);
    ddp::DistributedDataParallel ddp(ddp_models[r], comm);
    sgd_steps(ddp, ddp.parameters(), data, r, world);
    nn::convert_sync_batchnorm_in_place(*fsdp_models[r], comm);
    FullyShardedDataParallel fsdp(fsdp_models[r], comm);
    sgd_steps(fsdp, fsdp.parameters(), data, r, world);
    states[r] = full_state_dict(fsdp, false);
  }));
  for (int r = 0; r < world; ++r) CHECK(max_state_diff(states[r], ddp_models[r]->state_dict()) == 0.0);
}

TEST_CASE("trace: each unit's all-gather is issued while the unit before it computes; reduce-scatters run under backward") {
  manual_seed(9);
  auto start = nn::resnet_tiny(10, 4);
  std::vector<std::shared_ptr<nn::Module>> models = {start, start->clone()};
  const Batches data = make_batches(1, 4, kFloat32);
  trace::clear();
  trace::enable();
  int thread0 = -1;
  std::vector<std::string> unit_names;
  // Over TCP: collective all-gathers, prefetched (one-sided ones are not: the next case).
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    FullyShardedDataParallel fsdp(models[comm->rank()], comm);
    REQUIRE(!fsdp.runtime().gathers_one_sided());
    if (comm->rank() == 0) {
      thread0 = trace::thread_track();
      for (const Unit& unit : fsdp.units()) unit_names.push_back(unit.name);
    }
    sgd_steps(fsdp, fsdp.parameters(), data, comm->rank(), 2);
  }, 20s, /*shared_memory=*/false));
  trace::disable();
  const int comm0 = trace::track("comm (rank 0)");
  std::map<std::string, std::vector<trace::Event>> by_name;  // rank 0's spans, in recording order
  for (const trace::Event& e : trace::events())
    if (e.track == comm0 || e.track == thread0) by_name[e.name].push_back(e);
  trace::clear();
  REQUIRE(unit_names.size() == 6);  // stem, 4 BasicBlocks, head
  for (size_t k = 1; k < unit_names.size(); ++k) {
    CAPTURE(unit_names[k]);
    REQUIRE(by_name["forward " + unit_names[k - 1]].size() == 1);
    const trace::Event& previous = by_name["forward " + unit_names[k - 1]][0];
    REQUIRE(!by_name["all_gather " + unit_names[k]].empty());
    // Prefetched: issued before the unit before it finished its forward.
    CHECK(by_name["all_gather " + unit_names[k]][0].start_us < previous.start_us + previous.duration_us);
  }
  // FULL_SHARD gathers every unit but the last again for its backward.
  CHECK(by_name["all_gather stem"].size() == 2);
  CHECK(by_name["all_gather head"].size() == 1);
  for (const std::string& name : unit_names) CHECK(by_name["reduce_scatter " + name].size() == 1);
  // The head's reduce-scatter is launched before the stem is even gathered for its
  // backward: it overlaps the rest of backward.
  CHECK(by_name["reduce_scatter head"][0].start_us < by_name["all_gather stem"][1].start_us);
}

TEST_CASE("FULL_SHARD really frees: a unit's gathered pages go back after its forward and come back for its backward") {
  // Two 1024 x 1024 float64 units (8 MiB gathered each); the last is kept for backward.
  // Both layouts: the per-parameter one copies its pieces out into the same releasable
  // buffer (Note [Per-parameter shards]).
  for (const bool per_parameter : {false, true}) {
    CAPTURE(per_parameter);
    auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(1024, 1024), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(1024, 10)});
    net->to(kFloat64);
    std::vector<std::shared_ptr<nn::Module>> models = {net, net->clone()};
    Tensor x = randn({4, 1024}, kFloat64);
    Tensor y = randint(0, 10, {4});
    std::vector<std::vector<size_t>> after_forward(2), after_backward(2);
    require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      FullyShardedDataParallel fsdp(models[r], comm,
                                    {.auto_wrap_policy = {{"Linear"}}, .per_parameter_sharding = per_parameter});
      Tensor loss = cross_entropy(fsdp(shard(x, r, 2)), shard(y, r, 2));
      for (const Unit& unit : fsdp.units())
        if (unit.flat) after_forward[r].push_back(unit.flat->gathered_resident_bytes());
      loss.backward();  // would read zeros from the freed unit without its re-gather
      for (const Unit& unit : fsdp.units())
        if (unit.flat) after_backward[r].push_back(unit.flat->gathered_resident_bytes());
    }));
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE(after_forward[r].size() == 2);
      CHECK(after_forward[r][0] == 0);                   // freed after its forward
      CHECK(after_forward[r][1] >= 10 * 1025 * 8 - 8);   // the last unit: kept for its backward
      CHECK(after_backward[r] == std::vector<size_t>{0, 0});
    }
  }
}

TEST_CASE("keep_last_gathered: the last units stay gathered from forward to backward; the others are freed") {
  // Three 512 x 512 float64 units (2 MiB gathered each).
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(512, 512), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(512, 512),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(512, 10)});
  net->to(kFloat64);
  Tensor x = randn({4, 512}, kFloat64);
  Tensor y = randint(0, 10, {4});
  for (int keep : {0, 1, 2, 3}) {
    CAPTURE(keep);
    std::vector<std::shared_ptr<nn::Module>> models = {net->clone(), net->clone()};
    std::vector<std::vector<bool>> kept(2);
    std::vector<size_t> after_backward(2, 1);
    std::vector<int64_t> all_gathers(2, 0);
    std::vector<int> thread_track(2, -1);
    trace::clear();
    trace::enable();
    require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      thread_track[r] = trace::thread_track();  // one-sided gathers are recorded here
      FullyShardedDataParallel fsdp(models[r], comm, {.auto_wrap_policy = {{"Linear"}}, .keep_last_gathered = keep});
      Tensor loss = cross_entropy(fsdp(shard(x, r, 2)), shard(y, r, 2));
      for (const Unit& unit : fsdp.units())
        if (unit.flat) kept[r].push_back(unit.flat->gathered_resident_bytes() > 0);
      loss.backward();
      after_backward[r] = 0;
      for (const Unit& unit : fsdp.units())
        if (unit.flat) after_backward[r] += unit.flat->gathered_resident_bytes();
    }));
    trace::disable();
    for (const trace::Event& e : trace::events())
      if (e.name.rfind("all_gather ", 0) == 0)
        ++all_gathers[e.track == trace::track("comm (rank 0)") || e.track == thread_track[0] ? 0 : 1];
    trace::clear();
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      std::vector<bool> expected = {keep >= 3, keep >= 2, keep >= 1};
      CHECK(kept[r] == expected);
      CHECK(after_backward[r] == 0);  // every unit freed once its gradient is reduced
      // Each unit is gathered for its forward, and again for its backward unless kept.
      CHECK(all_gathers[r] == 3 + (3 - std::min(keep, 3)));
    }
  }
  auto bad = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    FullyShardedDataParallel fsdp(net->clone(), comm, {.keep_last_gathered = -1});
  });
  for (int r = 0; r < 2; ++r) CHECK(contains(bad[r], "keep_last_gathered is the number of last units"));
}

TEST_CASE("one-sided gathers: no rank reads a shard before its owner's step is over, or after its next one began") {
  // Note [When one-sided gathers may read]. Rank 1 dawdles before each optimizer step,
  // so that without the barrier at the start of each forward rank 0 would gather rank
  // 1's shards before they were stepped; an evaluation forward (no backward follows
  // it) and the final full_state_dict gather one-sidedly too.
  // A net without buffers: FSDP's buffer broadcast before a forward would meet the
  // ranks as well as the barrier does.
  manual_seed(12);
  auto start = small_net();
  const int world = 2;
  const Batches data = make_batches(3, 2 * world, kFloat64);
  const auto reference = ddp_reference(start, data, world);
  for (bool shared_memory : {true, false}) {
    CAPTURE(shared_memory);
    std::vector<std::shared_ptr<nn::Module>> replicas = {start->clone(), start->clone()};
    std::vector<OrderedDict<Tensor>> states(world);
    std::vector<char> one_sided(world);  // char, not bool: vector<bool> packs both ranks' flags in one word
    require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
      const int r = comm->rank();
      FullyShardedDataParallel fsdp(replicas[r], comm, {.auto_wrap_policy = kSmallNetPolicy});
      one_sided[r] = fsdp.runtime().gathers_one_sided();
      optim::SGD opt(fsdp.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
      for (size_t s = 0; s < data.images.size(); ++s) {
        Tensor loss = cross_entropy(fsdp(shard(data.images[s], r, world)), shard(data.labels[s], r, world));
        opt.zero_grad();
        loss.backward();
        if (r == 1) std::this_thread::sleep_for(30ms);
        opt.step();
      }
      {
        NoGradGuard no_grad;  // an evaluation forward: it gathers every unit too
        fsdp(shard(data.images[0], r, world));
      }
      states[r] = full_state_dict(fsdp, /*rank0_only=*/false);
    }, 20s, shared_memory));
    CHECK(one_sided == std::vector<char>{shared_memory, shared_memory});
    for (int r = 0; r < world; ++r) {
      CHECK(max_state_diff(states[r], reference[r]) == 0.0);  // bitwise DDP's
    }
  }
}

namespace {
// Passes its input through; its parameter takes no part in the loss.
class Bystander : public nn::Cloneable<Bystander> {
 public:
  Bystander() : Cloneable("Bystander") { reset(); }
  void reset() override { w = register_parameter("w", zeros({3}, kFloat64)); }
  Tensor forward(const Tensor& x) override { return x; }
  Tensor w;
};
}  // namespace

TEST_CASE("a parameter without a gradient is an error naming it and its unit, on every rank") {
  std::vector<std::shared_ptr<nn::Module>> models;
  for (int r = 0; r < 2; ++r) {
    auto net = small_net();
    net->push_back(std::make_shared<Bystander>());
    models.push_back(net);
  }
  Tensor x = randn({4, 3, 8, 8}, kFloat64);
  auto errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    FullyShardedDataParallel fsdp(models[comm->rank()], comm, {.auto_wrap_policy = kSmallNetPolicy});
    fsdp(shard(x, comm->rank(), 2)).sum().backward();
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(contains(errors[r], "did not receive every parameter's gradient"));
    CHECK(contains(errors[r], "6.w (unit head)"));
  }
}

TEST_CASE("optimizer state: consolidated on rank 0, loaded back shard by shard, training continues bit for bit") {
  manual_seed(10);
  auto start = small_net();
  const int world = 3;
  const Batches data = make_batches(4, 2 * world, kFloat64);
  Batches first = data, second = data;
  first.images.resize(2), first.labels.resize(2);
  second.images.erase(second.images.begin(), second.images.begin() + 2);
  second.labels.erase(second.labels.begin(), second.labels.begin() + 2);
  std::vector<std::shared_ptr<nn::Module>> straight, before, after;
  for (int r = 0; r < world; ++r) {
    straight.push_back(start->clone());
    before.push_back(start->clone());
    after.push_back(small_net());  // another initialisation: everything comes from the checkpoint
  }
  auto steps = [&](FullyShardedDataParallel& fsdp, optim::SGD& opt, const Batches& batches, int r) {
    for (size_t s = 0; s < batches.images.size(); ++s) {
      Tensor loss = cross_entropy(fsdp(shard(batches.images[s], r, world)), shard(batches.labels[s], r, world));
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
  };
  std::vector<OrderedDict<Tensor>> uninterrupted(world), resumed(world);
  std::vector<size_t> optim_sizes(world);
  const optim::SGDOptions sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};
  const FSDPOptions options{.auto_wrap_policy = kSmallNetPolicy};
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    {
      FullyShardedDataParallel fsdp(straight[r], comm, options);
      optim::SGD opt(fsdp.parameters(), sgd);
      steps(fsdp, opt, data, r);
      uninterrupted[r] = full_state_dict(fsdp, false);
    }
    OrderedDict<Tensor> model_state, optim_state;
    {
      FullyShardedDataParallel fsdp(before[r], comm, options);
      optim::SGD opt(fsdp.parameters(), sgd);
      steps(fsdp, opt, first, r);
      model_state = full_state_dict(fsdp, false);
      optim_state = full_optim_state_dict(fsdp, opt, false);
      optim_sizes[r] = full_optim_state_dict(fsdp, opt).size();  // rank0_only
    }
    FullyShardedDataParallel fsdp(after[r], comm, options);
    optim::SGD opt(fsdp.parameters(), sgd);
    load_full_state_dict(fsdp, model_state);
    load_full_optim_state_dict(fsdp, opt, optim_state);
    steps(fsdp, opt, second, r);
    resumed[r] = full_state_dict(fsdp, false);
    // The consolidated momentum of the first unit (Conv2d(3, 6, 3): 168 values) is whole.
    CHECK(optim_state.find("state.0.momentum_buffer")->numel() == 6 * 3 * 3 * 3 + 6);
  }));
  CHECK(optim_sizes[0] > 0);
  CHECK(optim_sizes[1] == 0);
  for (int r = 0; r < world; ++r) CHECK(max_state_diff(resumed[r], uninterrupted[r]) == 0.0);
}
