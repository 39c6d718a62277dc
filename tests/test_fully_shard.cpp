// fsdp::fully_shard: FSDP with every parameter cut on dim 0 (FSDP2's layout). Ranks are
// threads (tests/rank_threads.h); the harness is test_fsdp.cpp's (tests/fsdp_harness.h).
//
// The contract is the same transparency as the flat layout's, and one more: the
// optimizer sees each parameter under its own name, so AdamW with weight-decay exemptions
// by name ends with DDP's weights.
#include <doctest/doctest.h>

#include <algorithm>  // defines: std::any_of, std::find
#include <limits>
#include <set>

#include "autograd/ops.h"
#include "nn/nn.h"
#include "nn/optim/adamw.h"
#include "nn/optim/clip_grad.h"
#include "nn/optim/sgd.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/fsdp/per_parameter_layout.h"
#include "parallel/fsdp/sharded_state_dict.h"
#include "parallel/fsdp/state_dict.h"
#include "fsdp_harness.h"   // defines: Batches, train_steps, ddp_reference, fsdp_run, hybrid_2x2_groups
#include "rank_threads.h"   // defines: run_ranks, run_rank_threads
#include "transparency.h"   // defines: small_net

using namespace loom;
using namespace loom::fsdp;
using namespace loom::testing;
using distributed::Communicator;

TEST_CASE("per_parameter_layout: torch.chunk's rows of each parameter, each piece padded, equal shards") {
  // N = 3: [10, 4] -> 4, 4, 2 rows; [2] -> 1, 1, 0; [10] -> 4, 4, 2; [5, 3, 2, 2] -> 2, 2, 1;
  // a 0-d parameter counts as [1] -> 1, 0, 0.
  const std::vector<Shape> shapes = {{10, 4}, {2}, {10}, {5, 3, 2, 2}, {}};
  const PerParameterLayout layout = per_parameter_layout(shapes, 3);
  REQUIRE(layout.pieces.size() == 5);
  std::vector<int64_t> chunk_rows, row_numel, offsets, full_offsets;
  for (const ParameterPiece& piece : layout.pieces) {
    chunk_rows.push_back(piece.chunk_rows);
    row_numel.push_back(piece.row_numel);
    offsets.push_back(piece.offset);
    full_offsets.push_back(piece.full_offset);
  }
  CHECK(chunk_rows == std::vector<int64_t>{4, 1, 4, 2, 1});
  CHECK(row_numel == std::vector<int64_t>{4, 1, 1, 12, 1});
  CHECK(offsets == std::vector<int64_t>{0, 16, 17, 21, 45});       // pieces of 16, 1, 4, 24, 1
  CHECK(full_offsets == std::vector<int64_t>{0, 40, 42, 52, 112});  // the parameters, whole
  CHECK(layout.shard_size == 46);
  CHECK(layout.total == 113);
  CHECK(layout.slot(3, 1) == 46 + 21);
  CHECK(layout.rows_of(0, 2).offset == 8);
  CHECK(layout.rows_of(0, 2).length == 2);
  CHECK(layout.rows_of(1, 2).length == 0);  // [2] over 3 ranks: the last holds none
  CHECK(layout.rows_of(3, 2).length == 1);
  CHECK(layout.local_shape(0, shapes[0], 2) == Shape{2, 4});
  CHECK(layout.local_shape(1, shapes[1], 2) == Shape{0});
  CHECK(layout.local_shape(3, shapes[3], 1) == Shape{2, 3, 2, 2});
  CHECK(layout.local_shape(4, shapes[4], 0) == Shape{1});
  CHECK(layout.local_shape(4, shapes[4], 1) == Shape{0});
  CHECK_THROWS_WITH_AS(per_parameter_layout(shapes, 0), doctest::Contains("at least 1"), Error);

  // Packing each rank's shard and unpacking them all gives the values back; the padding is zero.
  const Tensor full = arange(1, 114, 1, TensorOptions(kFloat64));  // no zero among the values
  std::vector<Tensor> shards;
  for (int r = 0; r < 3; ++r) {
    shards.push_back(empty({layout.shard_size}, kFloat64));
    pack_shard(layout, full, r, shards.back());
  }
  // Rank 2: rows 8-9 of [10, 4] (values 33..40), then 8 zeros; [2]'s piece is padding.
  CHECK(shards[2].narrow(0, 0, 8).tolist<double>() == arange(33, 41, 1, TensorOptions(kFloat64)).tolist<double>());
  CHECK(shards[2].narrow(0, 8, 9).tolist<double>() == std::vector<double>(9, 0.0));
  CHECK(shards[1].narrow(0, 16, 1).item<double>() == 42.0);  // [2]'s second row
  Tensor back = zeros({layout.total}, kFloat64);
  unpack_shards(layout, cat(shards, 0), back);
  CHECK(max_abs_diff(back, full) == 0.0);
}

namespace {

// small_net then Linear(10, 2), Linear(2, 10): a [2, 10] weight and a [2] bias, of which
// the third of 3 ranks holds no rows.
std::shared_ptr<nn::Sequential> uneven_net() {
  auto net = small_net();
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(10, 2));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(2, 10));
  net->to(kFloat64);
  return net;
}

FSDPOptions per_parameter(FSDPOptions options) {
  options.per_parameter_sharding = true;
  return options;
}

// As a user writes it: biases and normalisation weights at no weight decay, by name.
bool exempt_from_weight_decay(const std::string& name) {
  return name.ends_with(".bias") || name.find("bn") != std::string::npos ||
         name.find("downsample.1.") != std::string::npos;
}

std::unique_ptr<optim::Optimizer> adamw_with_exemptions(nn::Module& wrapped) {
  optim::ParamGroup decay{{}, {{"weight_decay", 0.05}}}, no_decay{{}, {{"weight_decay", 0.0}}};
  for (const auto& [name, p] : wrapped.named_parameters())
    (exempt_from_weight_decay(name) ? no_decay : decay).params.push_back(p);
  CHECK(!decay.params.empty());  // (a rank thread: CHECK, as REQUIRE's exception would end the process)
  CHECK(!no_decay.params.empty());
  return std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{no_decay, decay},
                                        optim::AdamWOptions{.lr = 1e-2});
}

}  // namespace

TEST_CASE("transparency: fully_shard under FULL_SHARD, SHARD_GRAD_OP and NO_SHARD ends with DDP's weights (float64)") {
  manual_seed(21);
  // The same per-element arithmetic as DDP and the flat layout: equal bits.
  check_every_strategy_equals_ddp(uneven_net(), per_parameter({.auto_wrap_policy = kSmallNetPolicy}), "uneven net");
}

TEST_CASE("transparency: fully_shard of a ResNet (tiny, BatchNorm, float32) ends with DDP's weights and buffers") {
  manual_seed(22);
  auto start = nn::resnet_tiny(10, 4);
  const int world = 3;
  const Batches data = make_batches(3, 2 * world, kFloat32);
  check_strategies_against(ddp_reference(start, data, world), start, data, world,
                           {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP}, per_parameter({}),
                           "resnet_tiny");
}

TEST_CASE("fully_shard: named_parameters are the single-process names, each local shard torch.chunk's rows") {
  auto start = nn::resnet_tiny(10, 4);
  const int world = 3;
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  std::vector<std::vector<std::string>> names(world);
  std::vector<std::vector<Shape>> shapes(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto fsdp = fully_shard(replicas[r], comm);
    for (const auto& [name, p] : fsdp->named_parameters()) {
      names[r].push_back(name);
      shapes[r].push_back(p.shape());
      CHECK(p.requires_grad());
      CHECK(p.is_leaf());
    }
    CHECK(fsdp->parameters().size() == names[r].size());
  }));
  const OrderedDict<Tensor> plain = start->named_parameters();
  int64_t held = 0, total = 0;
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(names[r] == plain.keys());
    for (size_t i = 0; i < names[r].size() && i < plain.size(); ++i) {
      Shape expected = plain.values()[i].shape();
      expected[0] = distributed::shard_range(expected[0], world, r).length;
      CHECK(shapes[r][i] == expected);
      held += numel(shapes[r][i]);
    }
  }
  for (const Tensor& p : plain.values()) total += p.numel();
  CHECK(held == total);  // every element on exactly one rank
  CHECK(std::find(names[0].begin(), names[0].end(), "layer1.0.conv1.weight") != names[0].end());
}

TEST_CASE("headline: AdamW with weight-decay exemptions by name under fully_shard ends with DDP's weights") {
  for (bool resnet : {false, true}) {
    CAPTURE(resnet);
    manual_seed(23);
    std::shared_ptr<nn::Module> start = resnet ? std::shared_ptr<nn::Module>(nn::resnet_tiny(10, 4)) : uneven_net();
    for (int world : {2, 3}) {
      CAPTURE(world);
      const Batches data = make_batches(3, 2 * world, resnet ? kFloat32 : kFloat64);
      const auto reference = ddp_reference(start, data, world, adamw_with_exemptions);
      std::vector<std::shared_ptr<nn::Module>> replicas;
      for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
      std::vector<OrderedDict<Tensor>> states(world);
      std::vector<std::set<std::string>> exempt(world);
      require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
        const int r = comm->rank();
        FSDPOptions options;
        if (!resnet) options.auto_wrap_policy = kSmallNetPolicy;
        auto fsdp = fully_shard(replicas[r], comm, options);
        auto opt = adamw_with_exemptions(*fsdp);
        // The library's timm-style groups agree with the user's on the FSDP2 module.
        const auto groups = optim::param_groups_weight_decay(*fsdp, 0.05);
        CHECK(groups.size() == 2);
        for (const auto& entry : fsdp->named_parameters()) {  // Note [doctest messages name no structured binding]
          const Tensor& p = entry.second;
          const bool in_no_decay = std::any_of(groups[0].params.begin(), groups[0].params.end(),
                                               [&](const Tensor& q) { return q.is_same(p); });
          if (in_no_decay) exempt[r].insert(entry.first);
        }
        train_steps(*fsdp, *opt, data, r, world);
        states[r] = full_state_dict(*fsdp, /*rank0_only=*/false);
      }));
      std::set<std::string> expected;
      for (const auto& [name, p] : start->named_parameters())
        if (exempt_from_weight_decay(name)) expected.insert(name);
      for (int r = 0; r < world; ++r) CHECK(exempt[r] == expected);
      // Elementwise AdamW on the same averaged gradients: equal bits.
      check_equals_reference(states, reference, std::string(resnet ? "resnet_tiny" : "uneven net") +
                                                    " AdamW world " + std::to_string(world));
    }
  }
}

TEST_CASE("fully_shard with HYBRID_SHARD on 4 ranks as 2 replicas x 2 shards ends with DDP's weights") {
  manual_seed(24);
  const int world = 4;
  for (bool resnet : {false, true}) {
    CAPTURE(resnet);
    std::shared_ptr<nn::Module> start = resnet ? std::shared_ptr<nn::Module>(nn::resnet_tiny(10, 4)) : uneven_net();
    start->to(kFloat64);
    const Batches data = make_batches(3, 2 * world, kFloat64);
    for (bool adamw : {false, true}) {
      CAPTURE(adamw);
      const MakeOptimizer make = adamw ? MakeOptimizer(adamw_with_exemptions) : MakeOptimizer(sgd_over_parameters);
      const auto reference = ddp_reference(start, data, world, make);
      std::vector<std::shared_ptr<nn::Module>> replicas;
      for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
      std::vector<OrderedDict<Tensor>> states(world);
      require_no_errors(run_rank_threads(world, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
        FSDPOptions options{.sharding_strategy = ShardingStrategy::HYBRID_SHARD};
        if (!resnet) options.auto_wrap_policy = kSmallNetPolicy;
        auto fsdp = fully_shard(replicas[r], hybrid_2x2_groups(r, store), options);
        auto opt = make(*fsdp);
        train_steps(*fsdp, *opt, data, r, world);
        states[r] = full_state_dict(*fsdp, /*rank0_only=*/false);
      }));
      // As the flat layout's HYBRID_SHARD test: the sums run in another order (within the
      // pair, then across) than DDP's 4-way sum.
      check_equals_reference(states, reference, std::string(resnet ? "resnet_tiny" : "uneven net") + " HYBRID 2x2",
                             resnet ? 1e-10 : 1e-15);
    }
  }
}

TEST_CASE("clip_grad_norm_ over FSDP's shards is the single-process norm (per-parameter and flat, HYBRID_SHARD)") {
  manual_seed(25);
  auto start = uneven_net();
  const Batches data = make_batches(2, 12, kFloat64);
  const double max_norm = 0.1;  // below the gradients' norm: clipping scales
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    CAPTURE(norm_type);
    // One process on the global batch: the norms before clipping, the weights after.
    auto plain = start->clone();
    std::vector<double> norms;
    {
      optim::SGD opt(plain->parameters(), {.lr = 0.1});
      for (size_t s = 0; s < data.images.size(); ++s) {
        opt.zero_grad();
        cross_entropy((*plain)(data.images[s]), data.labels[s]).backward();
        norms.push_back(nn::utils::clip_grad_norm_(plain->parameters(), max_norm, norm_type).item<double>());
        opt.step();
      }
    }
    REQUIRE(norms[0] > max_norm);
    for (int mode = 0; mode < 3; ++mode) {  // per-parameter, flat, per-parameter HYBRID_SHARD
      CAPTURE(mode);
      const int world = mode == 2 ? 4 : 3;
      std::vector<std::shared_ptr<nn::Module>> replicas;
      for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
      std::vector<std::vector<double>> fsdp_norms(world);
      std::vector<OrderedDict<Tensor>> states(world);
      require_no_errors(run_rank_threads(world, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
        std::shared_ptr<FullyShardedDataParallel> fsdp;
        if (mode == 2) {
          fsdp = fully_shard(replicas[r], hybrid_2x2_groups(r, store),
                             {.sharding_strategy = ShardingStrategy::HYBRID_SHARD, .auto_wrap_policy = kSmallNetPolicy});
        } else {
          omp_set_num_threads(1);
          distributed::GlooOptions gloo;
          gloo.timeout = std::chrono::seconds(20);
          auto comm = std::make_shared<distributed::GlooCommunicator>(store, "ranks", r, world, gloo);
          fsdp = std::make_shared<FullyShardedDataParallel>(
              replicas[r], comm, FSDPOptions{.auto_wrap_policy = kSmallNetPolicy, .per_parameter_sharding = mode == 0});
        }
        optim::SGD opt(fsdp->parameters(), {.lr = 0.1});
        for (size_t s = 0; s < data.images.size(); ++s) {
          opt.zero_grad();
          cross_entropy((*fsdp)(shard(data.images[s], r, world)), shard(data.labels[s], r, world)).backward();
          fsdp_norms[r].push_back(clip_grad_norm_(*fsdp, max_norm, norm_type).item<double>());
          opt.step();
        }
        states[r] = full_state_dict(*fsdp, /*rank0_only=*/false);
      }));
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        for (size_t s = 0; s < norms.size(); ++s) CHECK(fsdp_norms[r][s] == doctest::Approx(norms[s]).epsilon(1e-12));
        CHECK(max_state_diff(states[r], plain->state_dict()) < 1e-14);
      }
    }
  }
}

TEST_CASE("fully_shard checkpoints: full and sharded model and AdamW state load back; training continues bit for bit") {
  manual_seed(26);
  auto start = uneven_net();
  const int world = 3;
  const Batches data = make_batches(4, 2 * world, kFloat64);
  Batches first = data, second = data;
  first.images.resize(2), first.labels.resize(2);
  second.images.erase(second.images.begin(), second.images.begin() + 2);
  second.labels.erase(second.labels.begin(), second.labels.begin() + 2);
  std::vector<std::shared_ptr<nn::Module>> straight, before, after_full, after_sharded, flat;
  for (int r = 0; r < world; ++r) {
    straight.push_back(start->clone());
    before.push_back(start->clone());
    after_full.push_back(uneven_net());  // other initialisations: everything comes from the checkpoint
    after_sharded.push_back(uneven_net());
    flat.push_back(uneven_net());
  }
  const FSDPOptions options{.auto_wrap_policy = kSmallNetPolicy};
  std::vector<OrderedDict<Tensor>> uninterrupted(world), resumed_full(world), resumed_sharded(world);
  std::vector<Shape> consolidated(world);
  std::vector<std::string> mismatch(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    {
      auto fsdp = fully_shard(straight[r], comm, options);
      auto opt = adamw_with_exemptions(*fsdp);
      train_steps(*fsdp, *opt, data, r, world);
      uninterrupted[r] = full_state_dict(*fsdp, false);
    }
    OrderedDict<Tensor> model_full, optim_full, model_shard, optim_shard;
    safetensors::Metadata layout;
    {
      auto fsdp = fully_shard(before[r], comm, options);
      auto opt = adamw_with_exemptions(*fsdp);
      train_steps(*fsdp, *opt, first, r, world);
      model_full = full_state_dict(*fsdp, false);
      optim_full = full_optim_state_dict(*fsdp, *opt, false);
      model_shard = sharded_state_dict(*fsdp);
      optim_shard = opt->state_dict();  // already per local shard
      layout = sharding_metadata(*fsdp);
    }
    // The uneven Linear(10, 2)'s weight ("7.weight": parameter 8 of the optimizer, after
    // the five biases of group 0 and the weights of layers 0, 2 and 5): its AdamW moment
    // consolidates to [2, 10] on every rank, rank 2's [0, 10] included.
    consolidated[r] = optim_full.find("state.8.exp_avg")->shape();
    {
      auto fsdp = fully_shard(after_full[r], comm, options);
      auto opt = adamw_with_exemptions(*fsdp);
      load_full_state_dict(*fsdp, model_full);
      load_full_optim_state_dict(*fsdp, *opt, optim_full);
      train_steps(*fsdp, *opt, second, r, world);
      resumed_full[r] = full_state_dict(*fsdp, false);
    }
    {
      auto fsdp = fully_shard(after_sharded[r], comm, options);
      auto opt = adamw_with_exemptions(*fsdp);
      check_sharded_compatible(*fsdp, layout, "memory");
      load_sharded_state_dict(*fsdp, model_shard);
      opt->load_state_dict(optim_shard);
      train_steps(*fsdp, *opt, second, r, world);
      resumed_sharded[r] = full_state_dict(*fsdp, false);
    }
    FullyShardedDataParallel flat_fsdp(flat[r], comm, options);  // the flat layout's shards do not fit
    try {
      check_sharded_compatible(flat_fsdp, layout, "memory");
    } catch (const Error& e) {
      mismatch[r] = e.what();
    }
  }));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    CHECK(consolidated[r] == Shape{2, 10});
    CHECK(max_state_diff(resumed_full[r], uninterrupted[r]) == 0.0);
    CHECK(max_state_diff(resumed_sharded[r], uninterrupted[r]) == 0.0);
    CHECK(contains(mismatch[r], "layout: the checkpoint has per_parameter, this run has nothing"));
  }
}

TEST_CASE("named_dtensors: each local shard is a DTensor Shard(0) of its parameter's global shape") {
  auto start = uneven_net();
  const int world = 3;
  std::vector<std::shared_ptr<nn::Module>> replicas, flat_models;
  for (int r = 0; r < world; ++r) {
    replicas.push_back(start->clone());
    flat_models.push_back(uneven_net());
  }
  std::vector<double> diffs(world, -1);
  std::vector<std::string> flat_error(world);
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto fsdp = fully_shard(replicas[r], comm, {.auto_wrap_policy = kSmallNetPolicy});
    const OrderedDict<Tensor> whole = start->named_parameters();
    double diff = 0;
    for (const auto& entry : named_dtensors(*fsdp)) {  // Note [doctest messages name no structured binding]
      const std::string& name = entry.first;
      const distributed::DTensor& dtensor = entry.second;
      const Tensor* original = whole.find(name);
      CHECK_MESSAGE(original, name);
      CHECK(dtensor.placement() == distributed::Shard(0));
      CHECK(dtensor.to_local().is_same(*fsdp->named_parameters().find(name)));
      Tensor full = dtensor.full_tensor();  // a collective: every rank, every parameter
      if (!original) continue;
      CHECK(dtensor.shape() == original->shape());
      diff = std::max(diff, max_abs_diff(full, *original));
    }
    diffs[r] = diff;
    FullyShardedDataParallel flat(flat_models[r], comm, {.auto_wrap_policy = kSmallNetPolicy});
    try {
      named_dtensors(flat);
    } catch (const Error& e) {
      flat_error[r] = e.what();
    }
  }));
  for (int r = 0; r < world; ++r) {
    CHECK(diffs[r] == 0.0);
    CHECK(contains(flat_error[r], "has the flat layout"));
  }
}

TEST_CASE("fully_shard: an optimizer over the unsharded module's parameters is an error at the third forward") {
  const Batches data = make_batches(3, 4, kFloat64);
  std::vector<std::shared_ptr<nn::Module>> models = {uneven_net(), uneven_net()};
  auto errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    auto fsdp = fully_shard(models[r], comm, {.auto_wrap_policy = kSmallNetPolicy});
    sgd_steps(*fsdp, models[r]->parameters(), data, r, 2);  // wrong: not fsdp->parameters()
  });
  for (int r = 0; r < 2; ++r)
    CHECK(contains(errors[r], "the last 2 backwards reduced gradients into the sharded parameters, but no optimizer"));
}
