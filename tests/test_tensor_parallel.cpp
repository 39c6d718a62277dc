// Tensor parallelism (parallel/tensor/parallel_style.h, parallelize_module.h, resnet_plan.h,
// tp_state_dict.h) against one process: column- and row-parallel Linear and Conv2d layers
// (forward and every gradient, float64, on 2 and 3 ranks: channels that do not divide
// evenly), a tiny ResNet trained 3 SGD steps at tp = 2 against single-device training, the
// bytes each step moves against the formula, full_state_dict's names and shapes, and the
// errors a wrong plan gets.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"                        // defines: sum, mul
#include "core/factory.h"                        // defines: randn
#include "core/generator.h"                      // defines: manual_seed
#include "nn/nn.h"                               // defines: Linear, Conv2d, BatchNorm2d, ReLU, Sequential, resnet_tiny
#include "nn/model_state.h"                     // defines: model_state_bytes
#include "nn/optim/sgd.h"                        // defines: SGD
#include "parallel/tensor/parallelize_module.h"  // defines: parallelize_module, the styles
#include "parallel/tensor/resnet_plan.h"         // defines: resnet_tp_plan
#include "parallel/tensor/tp_state_dict.h"       // defines: full_state_dict, load_full_state_dict
#include "parallel/tensor/vit_plan.h"            // defines: vit_tp_plan
#include "rank_threads.h"                        // defines: run_ranks, require_no_errors

using namespace loom;
using namespace loom::distributed;
using loom::testing::require_no_errors;
using loom::testing::run_ranks;

namespace {

// Largest |a - b|; infinity when the shapes differ (so a wrong shape fails the CHECK).
double diff(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  double m = 0;
  auto x = a.to(kFloat64).tolist<double>(), y = b.to(kFloat64).tolist<double>();
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// This rank's rows of a reference tensor, as `spec` cut it (the whole tensor when unsplit).
Tensor rows_of(const Tensor& whole, const DTensorSpec* spec) {
  if (spec == nullptr) return whole;
  const ShardRange r = shard_range(whole.size(spec->placement.dim), spec->group->size(), spec->group->rank());
  return whole.narrow(spec->placement.dim, r.offset, r.length);
}

// The reference: one process runs `model` on `x` and back-propagates sum(y * weights).
struct Reference {
  Tensor output, input_grad;
  OrderedDict<Tensor> grads;  // by parameter name
};
Reference run_reference(nn::Module& model, const Tensor& x, const Tensor& weights) {
  Tensor leaf = x.clone().requires_grad_(true);
  Reference ref;
  ref.output = model(leaf);
  sum(mul(ref.output, weights)).backward();
  ref.input_grad = leaf.grad();
  for (const auto& [name, p] : model.named_parameters()) ref.grads.insert(name, p.grad());
  return ref;
}

// Splits a copy of `model` with `plan` on `tp` thread ranks and checks that the output,
// the input's gradient and every parameter's gradient (this rank's rows of it) equal the
// reference's; returns the largest difference seen on any rank.
double split_error(const nn::Module& model, const ParallelizePlan& plan, int tp, const Tensor& x,
                   const Tensor& weights) {
  auto reference_model = model.clone();
  const Reference ref = run_reference(*reference_model, x, weights);
  std::vector<double> errors(static_cast<size_t>(tp), 0.0);
  require_no_errors(run_ranks(tp, [&](std::shared_ptr<Communicator> comm) {
    auto mine = model.clone();
    const StatePlacements placements = parallelize_module(*mine, comm, plan);
    Tensor leaf = x.clone().requires_grad_(true);
    Tensor y = (*mine)(leaf);
    sum(mul(y, weights)).backward();
    double e = std::max(diff(y, ref.output), diff(leaf.grad(), ref.input_grad));
    for (const auto& [name, p] : mine->named_parameters())
      e = std::max(e, diff(p.grad(), rows_of(ref.grads[name], placements.find(name))));
    errors[static_cast<size_t>(comm->rank())] = e;
  }));
  return *std::max_element(errors.begin(), errors.end());
}

std::shared_ptr<nn::Sequential> sequential(std::vector<std::shared_ptr<nn::Module>> layers) {
  auto seq = std::make_shared<nn::Sequential>(std::move(layers));
  seq->to(kFloat64);
  return seq;
}

}  // namespace

TEST_CASE("plan patterns match whole names, '*' within one") {
  CHECK(matches_module_pattern("layer*.*.conv1", "layer3.0.conv1"));
  CHECK_FALSE(matches_module_pattern("layer*.*.conv1", "layer3.0.downsample.0"));
  CHECK_FALSE(matches_module_pattern("layer*.*.conv1", "layer3.conv1"));
  CHECK(matches_module_pattern("fc", "fc"));
  CHECK_FALSE(matches_module_pattern("fc", "fc2"));
  CHECK(matches_module_pattern("fc?", "fc2"));
}

TEST_CASE("a column- then row-parallel Linear pair equals the unsplit pair, forward and every gradient") {
  for (int tp : {2, 3}) {
    CAPTURE(tp);
    manual_seed(1);
    // 7 hidden features: 4, 3 on 2 ranks; 3, 3, 1 on 3.
    auto model = sequential({std::make_shared<nn::Linear>(6, 7), std::make_shared<nn::ReLU>(),
                             std::make_shared<nn::Linear>(7, 5)});
    Tensor x = randn({4, 6}, kFloat64), w = randn({4, 5}, kFloat64);
    CHECK(split_error(*model, {{"0", ColwiseParallel()}, {"2", RowwiseParallel()}}, tp, x, w) <= 1e-12);
    // Alone, with PyTorch's other layouts: a column-parallel layer gathered whole, and a
    // row-parallel one cutting its whole input itself.
    auto single = sequential({std::make_shared<nn::Linear>(6, 7)});
    Tensor w7 = randn({4, 7}, kFloat64);
    CHECK(split_error(*single, {{"0", ColwiseParallel({.output_layouts = Replicate()})}}, tp, x, w7) <= 1e-12);
    CHECK(split_error(*single, {{"0", RowwiseParallel({.input_layouts = Replicate()})}}, tp, x, w7) <= 1e-12);
  }
}

TEST_CASE("Conv2d column-parallel, BatchNorm on its channels, Conv2d row-parallel (with biases) equal the unsplit "
          "block") {
  for (int tp : {2, 3}) {
    CAPTURE(tp);
    manual_seed(2);
    // 5 middle channels: 3, 2 on 2 ranks; 2, 2, 1 on 3.
    auto block = sequential({std::make_shared<nn::Conv2d>(3, 5, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(5),
                             std::make_shared<nn::ReLU>(), std::make_shared<nn::Conv2d>(5, 4, 3, 1, 1)});
    Tensor x = randn({2, 3, 6, 6}, kFloat64), w = randn({2, 4, 6, 6}, kFloat64);
    const ParallelizePlan plan = {{"0", ColwiseParallel()}, {"1", ChannelParallel()}, {"3", RowwiseParallel()}};
    CHECK(split_error(*block, plan, tp, x, w) <= 1e-12);
  }
}

// What a ResNet trained `steps` SGD steps on `tp` ranks differs by from one process's,
// over every tensor of full_state_dict, and each rank's all-reduce traffic in the steps
// after the first.
struct TrainedSplit {
  double error = 0;
  std::vector<int64_t> bytes, calls, state_bytes;  // per rank
  int64_t state_bytes_single = 0;
};
using PlanFor = std::function<ParallelizePlan(nn::Module& model, int tp)>;
ParallelizePlan resnet_plan(nn::Module& model, int) { return resnet_tp_plan(dynamic_cast<nn::ResNet&>(model)); }

TrainedSplit train_split(const nn::Module& model, int tp, int steps, int64_t n, int64_t side,
                         const PlanFor& plan_for = resnet_plan) {
  int64_t out_state_bytes_single = 0;
  std::vector<Tensor> inputs, targets;
  for (int s = 0; s < steps; ++s) {
    inputs.push_back(randn({n, 3, side, side}, kFloat64));
    targets.push_back(randint(0, 10, {n}));
  }
  nn::CrossEntropyLoss criterion;
  // Returns the model's training state (parameters, gradients, momenta) in bytes.
  auto train = [&](nn::Module& m, const std::function<void()>& after_first) {
    optim::SGD opt(m.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      criterion(m(inputs[static_cast<size_t>(s)]), targets[static_cast<size_t>(s)]).backward();
      opt.step();
      if (s == 0) after_first();
    }
    return nn::model_state_bytes(m, opt);
  };
  auto reference = model.clone();
  out_state_bytes_single = train(*reference, [] {});
  const OrderedDict<Tensor> expected = reference->state_dict();
  TrainedSplit out;
  out.bytes = out.calls = out.state_bytes = std::vector<int64_t>(static_cast<size_t>(tp));
  out.state_bytes_single = out_state_bytes_single;
  std::vector<double> errors(static_cast<size_t>(tp), 0.0);
  require_no_errors(run_ranks(tp, [&](std::shared_ptr<Communicator> comm) {
    auto mine = model.clone();
    const StatePlacements placements = parallelize_module(*mine, comm, plan_for(*mine, tp));
    const size_t r = static_cast<size_t>(comm->rank());
    out.state_bytes[r] = train(*mine, [&] { comm->reset_traffic(); });
    out.bytes[r] = comm->traffic().all_reduce.bytes / (steps - 1);
    out.calls[r] = comm->traffic().all_reduce.calls / (steps - 1);
    const OrderedDict<Tensor> state = full_state_dict(*mine, placements);
    REQUIRE(state.size() == expected.size());
    double e = 0;
    for (const auto& [name, t] : state) e = std::max(e, diff(t, expected[name]));
    errors[r] = e;
  }));
  out.error = *std::max_element(errors.begin(), errors.end());
  return out;
}

TEST_CASE("a tiny ResNet at tp=2 trains 3 SGD steps to single-device weights, moving the formula's bytes") {
  manual_seed(3);
  auto model = nn::resnet_tiny(10, 8);
  model->to(kFloat64);
  const int64_t n = 4, side = 16;
  const TrainedSplit trained = train_split(*model, 2, 3, n, side);
  CHECK(trained.error <= 1e-10);
  // Each block: one all-reduce of conv2's output forward and one of conv1's input gradient
  // backward, in float64; over 2 ranks an all-reduce of S bytes moves 2(2-1)/2 S = S.
  int64_t block_bytes = 0;
  int64_t at = side, in = 8;
  for (int64_t width : {8, 16, 32, 64}) {
    const int64_t out_side = width == 8 ? at : at / 2;
    block_bytes += n * width * out_side * out_side * 8 + n * in * at * at * 8;
    at = out_side;
    in = width;
  }
  // Training state (parameter, gradient, momentum: 3 x 8 bytes each) per rank: the split
  // tensors (each block's conv1 and conv2 weights, bn1's weight and bias; all of even
  // rows here) halved, the rest (stem, shortcuts, bn2, head) whole.
  int64_t split = 0, whole = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    const bool is_split = name.rfind("layer", 0) == 0 && (name.find(".conv1.") != std::string::npos ||
                                                           name.find(".conv2.") != std::string::npos ||
                                                           name.find(".bn1.") != std::string::npos);
    (is_split ? split : whole) += p.numel();
  }
  CHECK(trained.state_bytes_single == 3 * 8 * (split + whole));
  for (size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(trained.calls[r] == 2 * 4);  // 4 blocks, f and g each
    CHECK(trained.bytes[r] == block_bytes);
    CHECK(trained.state_bytes[r] == 3 * 8 * (split / 2 + whole));
  }
}

TEST_CASE("a Bottleneck ResNet at tp=2 and 3 trains 2 SGD steps to single-device weights") {
  manual_seed(5);
  // Bottlenecks of widths 6, 8, 16, 32 (outputs 24 ... 128): 8 splits 4, 4 and 3, 3, 2.
  auto model = std::make_shared<nn::ResNet>(std::vector<int64_t>{1, 1, 1, 1}, std::vector<int64_t>{6, 8, 16, 32}, 10,
                                            nn::ResNetOptions{.block = nn::ResNetBlock::bottleneck});
  model->to(kFloat64);
  for (int tp : {2, 3}) {
    CAPTURE(tp);
    const TrainedSplit trained = train_split(*model, tp, 2, 4, 16);
    CHECK(trained.error <= 1e-10);
    CHECK(trained.calls[0] == 2 * 4);
  }
}

TEST_CASE("a ViT at tp=2 and 3 (heads split whole, the MLP unevenly) trains 2 SGD steps to single-device weights, "
          "with 2 all-reduces per block each way") {
  manual_seed(6);
  // 8x8 images of 4x4 patches: 4 tokens and the class token; 6 heads of 4 features (3 or 2
  // per rank); an MLP of 40 features (20, 20 and 14, 14, 12).
  auto vit = std::make_shared<nn::VisionTransformer>(nn::VisionTransformerOptions{
      .image_size = 8, .patch_size = 4, .num_layers = 2, .num_heads = 6, .hidden_dim = 24, .mlp_dim = 40});
  vit->to(kFloat64);
  const PlanFor plan = [](nn::Module& m, int tp) { return vit_tp_plan(dynamic_cast<nn::VisionTransformer&>(m), tp); };
  for (int tp : {2, 3}) {
    CAPTURE(tp);
    const TrainedSplit trained = train_split(*vit, tp, 2, 4, 8, plan);
    CHECK(trained.error <= 1e-10);
    // Per block: out_proj's and linear2's sums forward; the gradients of attention's input
    // (once for q, k and v) and of the MLP's input backward.
    CHECK(trained.calls[0] == 4 * 2);
  }
  CHECK_THROWS_WITH_AS(vit_tp_plan(*vit, 4), doctest::Contains("4 does not divide the model's 6 heads"), Error);
}

TEST_CASE("full_state_dict writes a single process's names and shapes; load_full_state_dict cuts them again") {
  manual_seed(4);
  auto model = nn::resnet_tiny(10, 8);
  const OrderedDict<Tensor> whole = model->state_dict();
  require_no_errors(run_ranks(3, [&](std::shared_ptr<Communicator> comm) {
    auto mine = std::dynamic_pointer_cast<nn::ResNet>(model->clone());
    const StatePlacements placements = parallelize_module(*mine, comm, resnet_tp_plan(*mine));
    // 4 blocks: conv1 and conv2 weights, bn1's weight, bias, running mean and variance.
    CHECK(placements.size() == 4 * 6);
    CHECK(mine->layer1->children()[0]->named_parameters()["conv1.weight"].size(0) ==
          shard_range(8, 3, comm->rank()).length);
    const OrderedDict<Tensor> state = full_state_dict(*mine, placements);
    REQUIRE(state.size() == whole.size());
    for (const auto& [name, t] : whole) {
      const std::string key = name;  // Note [doctest messages name no structured binding]
      CHECK_MESSAGE(diff(state[key], t) == 0.0, key);
    }
    auto fresh = std::dynamic_pointer_cast<nn::ResNet>(nn::resnet_tiny(10, 8));
    const StatePlacements fresh_placements = parallelize_module(*fresh, comm, resnet_tp_plan(*fresh));
    load_full_state_dict(*fresh, state, fresh_placements);
    for (const auto& [name, t] : mine->state_dict()) {
      const std::string key = name;
      CHECK_MESSAGE(diff(fresh->state_dict()[key], t) == 0.0, key);
    }
    CHECK(describe_placements(placements).find("layer1.0.conv1.weight Shard(dim=0) [8, 8, 3, 3]") !=
          std::string::npos);
  }));
}

TEST_CASE("a wrong plan is a clear error") {
  auto model = nn::resnet_tiny(10, 8);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto check = [&](const ParallelizePlan& plan, const std::string& message) {
      auto mine = model->clone();
      CHECK_THROWS_WITH_AS(parallelize_module(*mine, comm, plan), doctest::Contains(message.c_str()), Error);
    };
    check({{"layer9.*.conv1", ColwiseParallel()}}, "which matches no module of the ResNet (its modules: conv1, bn1");
    check({{"layer1.0.bn1", ColwiseParallel()}}, "applies to a Linear or a Conv2d; the plan names 'layer1.0.bn1', a "
          "BatchNorm2d");
    check({{"layer1.0.conv1", ChannelParallel()}}, "ChannelParallel applies to a BatchNorm2d");
    check({{"layer1.*.conv1", ColwiseParallel()}, {"layer*.0.conv1", RowwiseParallel()}},
          "'layer1.0.conv1' is matched by both 'layer1.*.conv1' and 'layer*.0.conv1'");
    check({}, "the plan is empty");
    check({{"fc", RowwiseParallel({.input_layouts = Shard(0)})}}, "input_layouts must be Shard(-1)");
  }));
  require_no_errors(run_ranks(3, [&](std::shared_ptr<Communicator> comm) {
    auto head = sequential({std::make_shared<nn::Linear>(4, 2)});
    CHECK_THROWS_WITH_AS(parallelize_module(*head, comm, {{"0", ColwiseParallel()}}),
                         doctest::Contains("its 2 rows there cut as torch.chunk cuts them into 1, 1, 0, and every "
                                           "rank needs one at least"),
                         Error);
  }));
  // forward called around the hooks would compute with a shard as if it were the whole weight.
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto pair = sequential({std::make_shared<nn::Linear>(4, 4)});
    parallelize_module(*pair, comm, {{"0", ColwiseParallel()}});
    CHECK_THROWS_WITH_AS((*pair)[0]->forward(ones({1, 4}, kFloat64)), doctest::Contains("call it as (*module)(x)"),
                         Error);
  }));
}
