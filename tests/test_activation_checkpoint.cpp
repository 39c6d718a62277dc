// Activation checkpointing (nn/checkpoint.h): a checkpointed segment keeps only its input
// and is recomputed in backward. The contract is bitwise: weights, gradients and
// BatchNorm's running statistics after training steps are those without checkpointing,
// under one process, DDP and FSDP; and the activations it keeps are fewer (measured).
#include <doctest/doctest.h>

#include <functional>  // defines: std::function (which modules to checkpoint)

#include "autograd/engine.h"     // defines: backward_within
#include "autograd/ops.h"        // defines: cross_entropy, conv2d, relu
#include "core/generator.h"      // defines: manual_seed, default_generator
#include "core/memory.h"         // defines: max_memory_allocated, reset_peak_memory_stats
#include "nn/checkpoint.h"       // defines: checkpoint, apply_activation_checkpointing
#include "nn/nn.h"               // defines: resnet_tiny, Sequential, Conv2d, BatchNorm2d, Dropout
#include "nn/optim/sgd.h"        // defines: optim::SGD
#include "parallel/ddp/distributed_data_parallel.h"  // defines: ddp::DistributedDataParallel
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: fsdp::FullyShardedDataParallel
#include "parallel/fsdp/state_dict.h"  // defines: fsdp::full_state_dict
#include "rank_threads.h"        // defines: run_ranks, require_no_errors, max_abs_diff

using namespace loom;
using namespace loom::testing;
using distributed::Communicator;

namespace {

// Every residual block: torchtitan's apply_ac "full" on a ResNet.
bool is_block(const std::string&, nn::Module& m) { return m.type_name() == "BasicBlock"; }

struct Data {
  std::vector<Tensor> images, labels;
};

Data make_data(int steps, int64_t batch) {
  Data d;
  for (int s = 0; s < steps; ++s) {
    d.images.push_back(randn({batch, 3, 8, 8}));
    d.labels.push_back(randint(0, 10, {batch}));
  }
  return d;
}

Tensor rank_share(const Tensor& global, int rank, int world) {
  const int64_t each = global.size(0) / world;
  return global.narrow(0, rank * each, each);
}

void sgd_steps(nn::Module& model, const std::vector<Tensor>& params, const Data& data, int rank = 0, int world = 1) {
  optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  for (size_t s = 0; s < data.images.size(); ++s) {
    Tensor loss = cross_entropy(model(rank_share(data.images[s], rank, world)), rank_share(data.labels[s], rank, world));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// Largest difference between two state dicts (weights and running statistics); the
// integer counters must be equal.
double max_state_diff(const OrderedDict<Tensor>& a, const OrderedDict<Tensor>& b) {
  REQUIRE(a.keys() == b.keys());
  double m = 0;
  for (const auto& [key, value] : a) {
    const Tensor other = *b.find(key);
    if (!is_floating(value.dtype())) {
      CHECK(value.tolist<int64_t>() == other.tolist<int64_t>());
      continue;
    }
    m = std::max(m, max_abs_diff(value, other));
  }
  return m;
}

using Marker = std::function<bool(const std::string&, nn::Module&)>;

std::shared_ptr<nn::Module> trained_single(const std::shared_ptr<nn::Module>& start, const Data& data,
                                           const Marker& mark) {
  auto model = start->clone();
  if (mark) nn::apply_activation_checkpointing(*model, mark);
  sgd_steps(*model, model->parameters(), data);
  return model;
}

std::vector<OrderedDict<Tensor>> trained_ddp(const std::shared_ptr<nn::Module>& start, const Data& data, int world,
                                             const Marker& mark) {
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) {
    replicas.push_back(start->clone());
    if (mark) nn::apply_activation_checkpointing(*replicas.back(), mark);
  }
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    ddp::DistributedDataParallel ddp(replicas[size_t(comm->rank())], comm);
    sgd_steps(ddp, ddp.parameters(), data, comm->rank(), world);
  }));
  std::vector<OrderedDict<Tensor>> states;
  for (const auto& replica : replicas) states.push_back(replica->state_dict());
  return states;
}

std::vector<OrderedDict<Tensor>> trained_fsdp(const std::shared_ptr<nn::Module>& start, const Data& data, int world,
                                              fsdp::ShardingStrategy strategy, const Marker& mark) {
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) {
    replicas.push_back(start->clone());
    if (mark) nn::apply_activation_checkpointing(*replicas.back(), mark);
  }
  std::vector<OrderedDict<Tensor>> states(static_cast<size_t>(world));
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    fsdp::FullyShardedDataParallel model(replicas[size_t(comm->rank())], comm, {.sharding_strategy = strategy});
    sgd_steps(model, model.parameters(), data, comm->rank(), world);
    states[size_t(comm->rank())] = fsdp::full_state_dict(model, /*rank0_only=*/false);
  }));
  return states;
}

}  // namespace

TEST_CASE("checkpoint(fn, x): the same output, input gradient, parameter gradients and running statistics") {
  manual_seed(1);
  auto block = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(3, 4, 3, 1, 1), std::make_shared<nn::BatchNorm2d>(4), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Conv2d>(4, 4, 3, 1, 1)});
  block->to(kFloat64);
  auto twin = block->clone();
  const Tensor x0 = randn({2, 3, 6, 6}, kFloat64);

  Tensor x = x0.clone().requires_grad_(true);
  Tensor y = (*block)(x);
  (y * y).sum().backward();

  Tensor xc = x0.clone().requires_grad_(true);
  Tensor yc = nn::checkpoint([&](const Tensor& in) { return (*twin)(in); }, xc, twin.get());
  CHECK(yc.requires_grad());
  CHECK(max_abs_diff(y, yc) == 0.0);
  (yc * yc).sum().backward();
  CHECK(max_abs_diff(x.grad(), xc.grad()) == 0.0);
  const auto pa = block->parameters(), pb = twin->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(max_abs_diff(pa[i].grad(), pb[i].grad()) == 0.0);
  // BatchNorm updated its running statistics once, not once more in the recomputation.
  CHECK(max_state_diff(block->state_dict(), twin->state_dict()) == 0.0);
}

TEST_CASE("checkpoint: a segment whose input needs no gradient still gives its parameters theirs") {
  manual_seed(2);
  auto conv = std::make_shared<nn::Conv2d>(3, 2, 3, 1, 1);
  auto twin = std::dynamic_pointer_cast<nn::Conv2d>(conv->clone());
  const Tensor x = randn({1, 3, 4, 4});
  (*conv)(x).sum().backward();
  twin->set_activation_checkpointing(true);
  Tensor y = (*twin)(x);
  REQUIRE(y.requires_grad());
  y.sum().backward();
  CHECK(max_abs_diff(conv->weight.grad(), twin->weight.grad()) == 0.0);
  // Without grad mode a checkpointed module is its plain forward.
  NoGradGuard no_grad;
  CHECK_FALSE((*twin)(x).requires_grad());
}

TEST_CASE("checkpoint: a Dropout in the segment draws the same mask again, and the generator moves as without") {
  auto make = [] {
    manual_seed(3);
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::Dropout>(0.5), std::make_shared<nn::Linear>(8, 2)});
  };
  auto plain = make();
  manual_seed(4);
  const Tensor x = randn({16, 8});
  Tensor out = (*plain)(x);
  Tensor loss = (out * out).sum();
  loss.backward();
  const uint64_t offset_plain = default_generator().offset();

  auto checkpointed = make();
  checkpointed->set_activation_checkpointing(true);
  manual_seed(4);
  const Tensor x2 = randn({16, 8});
  Tensor out2 = (*checkpointed)(x2);
  Tensor loss2 = (out2 * out2).sum();
  CHECK(default_generator().offset() == offset_plain);  // the forward drew as many as without
  loss2.backward();
  CHECK(default_generator().offset() == offset_plain);  // the recomputation drew from its own copy
  CHECK(loss.item<float>() == loss2.item<float>());
  const auto pa = plain->parameters(), pb = checkpointed->parameters();
  for (size_t i = 0; i < pa.size(); ++i) CHECK(max_abs_diff(pa[i].grad(), pb[i].grad()) == 0.0);
}

TEST_CASE("checkpoint: a recomputation that would be another forward is an error, not other gradients") {
  manual_seed(5);
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Dropout>(0.5)});
  net->set_activation_checkpointing(true);
  Tensor y = (*net)(randn({3, 4}));
  net->eval();  // the recomputation would draw no mask
  CHECK_THROWS_WITH_AS(y.sum().backward(), doctest::Contains("random numbers where the first drew"), Error);

  CHECK_THROWS_WITH_AS(autograd::backward_within({y}, {ones_like(y)}), doctest::Contains("no backward() is running"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::checkpoint(nullptr, y), doctest::Contains("the function is empty"), Error);
}

TEST_CASE("transparency: ResNet (tiny, BatchNorm) with every block or every other block checkpointed, 3 steps, one "
          "process: bitwise the weights and statistics without") {
  manual_seed(6);
  auto start = nn::resnet_tiny(10, 4);
  const Data data = make_data(3, 4);
  auto reference = trained_single(start, data, nullptr);
  int block = 0;
  const Marker every_other = [&block](const std::string& name, nn::Module& m) {
    return is_block(name, m) && block++ % 2 == 0;  // torchtitan's selective, every 2nd block
  };
  for (const Marker& mark : {Marker(is_block), every_other}) {
    auto model = trained_single(start, data, mark);
    const double diff = max_state_diff(model->state_dict(), reference->state_dict());
    MESSAGE("one process: max |checkpointed - not| = ", diff);
    CHECK(diff == 0.0);
  }
}

TEST_CASE("transparency: DDP and FSDP (full_shard, shard_grad_op) with checkpointed blocks end bitwise as without") {
  manual_seed(7);
  auto start = nn::resnet_tiny(10, 4);
  const int world = 2;
  const Data data = make_data(3, 4);
  const auto ddp_plain = trained_ddp(start, data, world, nullptr);
  // The head too: its gradients, the first of the backward, are then computed inside a
  // recomputation, where DDP's first hook queues its "all gradients are in" callback,
  // which must wait for the outer backward (Note [A backward inside a backward]).
  const Marker blocks_and_head = [](const std::string& name, nn::Module& m) { return is_block(name, m) || name == "fc"; };
  const auto ddp_ac = trained_ddp(start, data, world, blocks_and_head);
  for (int r = 0; r < world; ++r) {
    const double diff = max_state_diff(ddp_ac[size_t(r)], ddp_plain[size_t(r)]);
    MESSAGE("DDP rank ", r, ": max |checkpointed - not| = ", diff);
    CHECK(diff == 0.0);
  }
  for (auto strategy : {fsdp::ShardingStrategy::FULL_SHARD, fsdp::ShardingStrategy::SHARD_GRAD_OP}) {
    const auto plain = trained_fsdp(start, data, world, strategy, nullptr);
    const auto ac = trained_fsdp(start, data, world, strategy, is_block);
    for (int r = 0; r < world; ++r) {
      const double diff = max_state_diff(ac[size_t(r)], plain[size_t(r)]);
      MESSAGE("FSDP ", std::string(fsdp::strategy_name(strategy)), " rank ", r, ": max |checkpointed - not| = ", diff);
      CHECK(diff == 0.0);
    }
  }
}

TEST_CASE("memory: checkpointing every block lowers the step's peak; the saving is the blocks' activations") {
  manual_seed(8);
  auto start = nn::make_model("resnet18");
  const Device device("cpu:5");  // a virtual device of its own: its statistics are this test's
  const Tensor x = randn({64, 3, 32, 32}).to(device), t = randint(0, 10, {64}).to(device);
  auto peak_of_step = [&](const Marker& mark) {
    auto model = start->clone(device);
    if (mark) nn::apply_activation_checkpointing(*model, mark);
    reset_peak_memory_stats(device);
    const int64_t before = memory_allocated(device);
    cross_entropy((*model)(x), t).backward();
    return max_memory_allocated(device) - before;
  };
  const int64_t plain = peak_of_step(nullptr), checkpointed = peak_of_step(is_block);
  MESSAGE("resnet18 (CIFAR), batch 64: step peak above the start ", plain >> 10, " KiB without, ",
          checkpointed >> 10, " KiB with every block checkpointed");
  CHECK(checkpointed < plain * 3 / 4);
}
