// DistributedDataParallel and its Reducer. Ranks are threads (tests/rank_threads.h), each
// with its own communicator over real TCP.
//
// The contract is the transparency test: N DDP ranks, each on its 1/N of a batch, end
// with the same weights as one process trained on the whole batch.
#include <doctest/doctest.h>

#include <cstdlib>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/trace.h"
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "parallel/ddp/distributed_data_parallel.h"

using namespace loom;
using namespace loom::ddp;

TEST_CASE("LOOM_DISTRIBUTED_DEBUG: off, info, detail in any case; anything else is an error naming the choices") {
  ::unsetenv("LOOM_DISTRIBUTED_DEBUG");
  CHECK(debug_level_from_env() == DebugLevel::Off);
  ::setenv("LOOM_DISTRIBUTED_DEBUG", "INFO", 1);
  CHECK(debug_level_from_env() == DebugLevel::Info);
  ::setenv("LOOM_DISTRIBUTED_DEBUG", "detail", 1);
  CHECK(debug_level_from_env() == DebugLevel::Detail);
  ::setenv("LOOM_DISTRIBUTED_DEBUG", "verbose", 1);
  CHECK_THROWS_WITH_AS(debug_level_from_env(), doctest::Contains("expected OFF, INFO or DETAIL"), Error);
  ::unsetenv("LOOM_DISTRIBUTED_DEBUG");
}

TEST_CASE("find_unused_parameters walks the graph from the outputs") {
  Tensor a = ones({2}, kFloat64).requires_grad_(), b = ones({2}, kFloat64).requires_grad_();
  Tensor c = ones({2}, kFloat64).requires_grad_();
  Tensor out = (a * 2.0 + c).sum();
  CHECK(find_unused_parameters({out}, {a, b, c}) == std::vector<size_t>{1});
  CHECK(find_unused_parameters({a}, {a, b, c}) == std::vector<size_t>{1, 2});  // an output may be a parameter
}

// ---- NCCL's rule on a CPU-only machine -------------------------------------------------
// NCCL sends only CUDA tensors. A world-of-one communicator that moves tensors of one
// virtual device (cpu:1) and refuses every other plays its part here: everything DDP
// sends on its own behalf (shape tables, fingerprints, used-parameter counts) must be
// put on the communicator's tensor_device(), as Note [Metadata tensors travel on the
// communicator's device] says, and the gradients stay on the parameters' device.
namespace {

class OneDeviceCommunicator final : public distributed::Communicator {
 public:
  explicit OneDeviceCommunicator(Device device) : Communicator(0, 1, std::chrono::seconds(10)), device_(device) {}
  const char* backend() const override { return "one-device"; }
  Device tensor_device() const override { return device_; }
  std::vector<std::string> refused;  // what a real NCCL would have rejected
  int ops = 0;

 protected:
  std::shared_ptr<distributed::Work> launch(distributed::Op op) override {
    ++ops;
    auto check = [&](const Tensor& t) {
      if (t.defined() && t.device() != device_) refused.push_back(op.describe() + " on " + t.device().str());
    };
    check(op.tensor);
    for (const Tensor& t : op.list) check(t);
    // World of one: all_reduce and broadcast leave the tensor as it is.
    if (op.kind == distributed::OpKind::AllGather) op.list[0].copy_(op.tensor);
    if (op.kind == distributed::OpKind::ReduceScatter) Tensor(op.tensor).copy_(op.list[0]);
    auto work = std::make_shared<distributed::Work>(op.describe());
    work->finish();
    return work;
  }

 private:
  Device device_;
};

}  // namespace

TEST_CASE("to_communication_device: host-made tensors go where the communicator can move them") {
  OneDeviceCommunicator comm(Device("cpu:1"));
  Tensor host = from_vector<int64_t>({1, 2, 3}, {3});
  Tensor moved = distributed::to_communication_device(host, comm);
  CHECK(moved.device() == Device("cpu:1"));
  CHECK(moved.tolist<int64_t>() == std::vector<int64_t>{1, 2, 3});
  OneDeviceCommunicator cpu_comm(Device("cpu"));
  CHECK(distributed::to_communication_device(host, cpu_comm).is_same(host));  // no copy when already there
}

TEST_CASE("DDP sends only tensors of the communicator's device: construction, detail fingerprints, unused counts") {
  ::setenv("LOOM_DISTRIBUTED_DEBUG", "detail", 1);  // fingerprints go out too
  auto comm = std::make_shared<OneDeviceCommunicator>(Device("cpu:1"));
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(3, 2)});
  net->to(kFloat64);
  net->to(Device("cpu:1"));
  {
    DistributedDataParallel ddp(net, comm, {.find_unused_parameters = true});
    Tensor x = randn({5, 4}, kFloat64).to(Device("cpu:1"));
    ddp(x).sum().backward();
    CHECK(net->parameters()[0].grad().defined());
  }
  ::unsetenv("LOOM_DISTRIBUTED_DEBUG");
  CHECK(comm->ops >= 6);  // shape checks, broadcasts, buckets, used counts, with fingerprints
  std::string refused;
  for (const auto& r : comm->refused) refused += r + "\n";
  CHECK_MESSAGE(comm->refused.empty(), refused);
}

TEST_CASE("completion_us: a bucket's end time only once the host knows it (NCCL's wait() does not block)") {
  distributed::Work work("all_reduce #0");
  CHECK(completion_us(work) == -1);
  const int64_t before = trace::now_us();
  work.finish();
  CHECK(completion_us(work) >= before);
  CHECK(completion_us(work) <= trace::now_us());
}

#ifdef LOOM_WITH_GLOO
#include "rank_threads.h"
#include "transparency.h"  // defines: small_net, max_param_diff

using loom::testing::contains;
using loom::testing::max_abs_diff;
using loom::testing::max_param_diff;
using loom::testing::small_net;
using loom::testing::require_no_errors;
using loom::testing::run_ranks;
using distributed::Communicator;

namespace {

struct Batches {
  std::vector<Tensor> images, labels;  // one global batch per step
};

Batches make_batches(int steps, int64_t global_batch) {
  Batches b;
  for (int s = 0; s < steps; ++s) {
    b.images.push_back(randn({global_batch, 3, 8, 8}, kFloat64));
    b.labels.push_back(randint(0, 10, {global_batch}));
  }
  return b;
}

// Rank r's shard of a global batch: rows r*B .. (r+1)*B.
Tensor shard(const Tensor& global, int rank, int world) {
  const int64_t per_rank = global.size(0) / world;
  return global.narrow(0, rank * per_rank, per_rank);
}

void sgd_steps(nn::Module& model, const Batches& data, int rank, int world) {
  optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  for (size_t s = 0; s < data.images.size(); ++s) {
    Tensor loss = cross_entropy(model(shard(data.images[s], rank, world)), shard(data.labels[s], rank, world));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// Two linear heads; the forward uses `b` only when use_b.
class TwoHeads : public nn::Cloneable<TwoHeads> {
 public:
  TwoHeads() : Cloneable("TwoHeads") {
    reset();
    to(kFloat64);
  }
  void reset() override {
    a = register_module("a", std::make_shared<nn::Linear>(4, 3));
    b = register_module("b", std::make_shared<nn::Linear>(4, 3));
  }
  Tensor forward(const Tensor& x) override { return use_b ? a->forward(x) + b->forward(x) : a->forward(x); }
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = false;
};

}  // namespace

TEST_CASE("transparency: N DDP ranks on shards end with the weights of one process on the union batch") {
  manual_seed(1);
  auto reference_start = small_net();
  struct Case {
    int world;
    DDPOptions options;
    bool shared_memory = true;  // the gloo backend's transport: shared memory, or TCP
  };
  // Small buckets: several all_reduces per backward, launched while backward runs.
  std::vector<Case> cases = {{2, {}},
                             {2, {.bucket_cap_mb = 0.002, .gradient_as_bucket_view = true}},
                             {3, {.bucket_cap_mb = 0.002}},
                             {2, {.bucket_cap_mb = 0.002}, /*shared_memory=*/false},
                             {3, {}, /*shared_memory=*/false}};
  for (const Case& c : cases) {
    CAPTURE(c.world);
    CAPTURE(c.options.bucket_cap_mb);
    CAPTURE(c.shared_memory);
    const Batches data = make_batches(3, 4 * c.world);
    auto reference = reference_start->clone();
    sgd_steps(*reference, data, 0, 1);
    std::vector<std::shared_ptr<nn::Module>> replicas;
    for (int r = 0; r < c.world; ++r) replicas.push_back(reference_start->clone());
    std::vector<size_t> buckets(c.world);
    require_no_errors(run_ranks(c.world, [&](std::shared_ptr<Communicator> comm) {
      DistributedDataParallel ddp(replicas[comm->rank()], comm, c.options);
      buckets[comm->rank()] = ddp.reducer().buckets().size();
      sgd_steps(ddp, data, comm->rank(), c.world);
    }, std::chrono::seconds(20), c.shared_memory));
    if (c.options.bucket_cap_mb < 1) CHECK(buckets[0] >= 3);
    for (int r = 0; r < c.world; ++r) {
      CAPTURE(r);
      CHECK(max_param_diff(*replicas[r], *reference) < 1e-12);
    }
  }
}

TEST_CASE("construction broadcasts rank 0's parameters and buffers; forward broadcasts rank 0's buffers") {
  std::vector<std::shared_ptr<nn::Sequential>> models;
  for (int r = 0; r < 2; ++r) {
    auto m = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Conv2d>(3, 4, 3), std::make_shared<nn::BatchNorm2d>(4)});
    NoGradGuard no_grad;
    for (Tensor& p : m->parameters()) p.fill_(r + 1);  // deliberately different on each rank
    m->named_buffers()["1.running_mean"].fill_(10 * r);
    models.push_back(m);
  }
  Tensor images = randn({4, 3, 6, 6});
  std::vector<std::vector<float>> after_train(2), after_eval(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    DistributedDataParallel ddp(models[r], comm);
    for (const Tensor& p : models[r]->parameters()) CHECK(p.tolist<float>() == std::vector<float>(p.numel(), 1.0f));
    CHECK(models[r]->named_buffers()["1.running_mean"].tolist<float>() == std::vector<float>(4, 0.0f));
    ddp(shard(images, r, 2) * float(r + 1)).sum().backward();  // different data: local running stats differ
    after_train[r] = models[r]->named_buffers()["1.running_mean"].tolist<float>();
    NoGradGuard no_grad;
    ddp.eval();
    ddp(shard(images, r, 2));  // the first forward after a synchronised one broadcasts buffers
    after_eval[r] = models[r]->named_buffers()["1.running_mean"].tolist<float>();
  }));
  CHECK(after_train[0] != after_train[1]);
  CHECK(after_eval[0] == after_train[0]);
  CHECK(after_eval[1] == after_train[0]);
}

TEST_CASE("state_dict keys carry PyTorch's module. prefix; the wrapped module's do not") {
  require_no_errors(run_ranks(1, [&](std::shared_ptr<Communicator> comm) {
    auto net = small_net();
    DistributedDataParallel ddp(net, comm);
    CHECK(ddp.state_dict().keys().front() == "module.0.weight");
    CHECK(ddp.module()->state_dict().keys().front() == "0.weight");
    CHECK(ddp.parameters().size() == net->parameters().size());
  }));
}

TEST_CASE("bucket layout: reverse registration order, a small first bucket, printed with names") {
  require_no_errors(run_ranks(1, [&](std::shared_ptr<Communicator> comm) {
    auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(256, 256), std::make_shared<nn::Linear>(256, 256),
        std::make_shared<nn::Linear>(256, 10)});
    DistributedDataParallel ddp(net, comm, {.bucket_cap_mb = 0.25});  // 256x256 float32 = 0.25 MiB
    const auto& buckets = ddp.reducer().buckets();
    REQUIRE(buckets.size() == 3);
    CHECK(buckets[0].params == std::vector<size_t>{5, 4, 3, 2});  // 2.bias, 2.weight, 1.bias, 1.weight
    // 0.bias + 0.weight exceed the last bucket's 0.25 MiB: 0.weight, the last gradient,
    // goes alone (Note [A small last bucket]).
    CHECK(buckets[1].params == std::vector<size_t>{1});
    CHECK(buckets[2].params == std::vector<size_t>{0});
    CHECK(buckets[0].flat.numel() == 10 + 2560 + 256 + 65536);
    std::string layout = ddp.reducer().layout();
    CHECK_MESSAGE(contains(layout, "3 buckets"), layout);
    CHECK(contains(layout, "2.bias -> 1.weight"));
    CHECK(contains(layout, "0.bias -> 0.bias"));
    CHECK(contains(layout, "0.weight -> 0.weight"));
    CHECK(contains(layout, std::to_string((10 + 2560 + 256 + 65536) * 4)));
  }));
}

TEST_CASE("overlap: bucket 0's all_reduce is launched before the last gradient is computed (trace timestamps)") {
  auto make = [] {
    std::vector<std::shared_ptr<nn::Module>> layers;
    for (int i = 0; i < 6; ++i) {
      layers.push_back(std::make_shared<nn::Linear>(256, 256));
      layers.push_back(std::make_shared<nn::ReLU>());
    }
    return std::make_shared<nn::Sequential>(layers);
  };
  std::vector<std::shared_ptr<nn::Module>> models = {make(), make()};
  Tensor x = randn({64, 256});
  trace::clear();
  trace::enable();
  std::vector<BackwardTimeline> timelines(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    DistributedDataParallel ddp(models[comm->rank()], comm, {.bucket_cap_mb = 0.25});  // one bucket per layer
    for (int step = 0; step < 2; ++step) {
      trace::Span span("backward", "test");
      ddp(x).pow(2).mean().backward();
    }
    timelines[comm->rank()] = ddp.reducer().last_backward();
  }));
  trace::disable();
  for (const BackwardTimeline& t : timelines) {
    // One bucket per layer, and layer 0's weight alone in the last (Note [A small last bucket]).
    REQUIRE(t.launch_us.size() == 7);
    CHECK(t.launch_us[0] < t.last_gradient_us);   // communication started during backward
    CHECK(t.last_gradient_us <= t.finalize_begin_us);
    for (size_t b = 0; b < 7; ++b) CHECK(t.launch_us[b] <= t.complete_us[b]);
  }
  // The same evidence in the trace: "all_reduce bucket 0" starts before "gradient hooks" ends.
  auto events = trace::events();
  int64_t bucket0_start = -1, hooks_end = -1;
  for (const auto& e : events) {
    if (e.name == "all_reduce bucket 0" && bucket0_start < 0) bucket0_start = e.start_us;
    if (e.name == "gradient hooks" && hooks_end < 0) hooks_end = e.start_us + e.duration_us;
  }
  CHECK(bucket0_start > 0);
  CHECK(bucket0_start < hooks_end);
  trace::clear();
}

TEST_CASE("no_sync accumulates locally; the next synchronised backward averages the accumulated sum") {
  manual_seed(2);
  auto start = small_net();
  Tensor mb1 = randn({4, 3, 8, 8}, kFloat64), mb2 = randn({4, 3, 8, 8}, kFloat64);
  Tensor y1 = randint(0, 10, {4}), y2 = randint(0, 10, {4});
  // Expected: the mean over ranks of each rank's (grad(mb1 shard) + grad(mb2 shard)).
  auto reference = start->clone();
  for (int r = 0; r < 2; ++r) {
    cross_entropy((*reference)(shard(mb1, r, 2)), shard(y1, r, 2)).backward();
    cross_entropy((*reference)(shard(mb2, r, 2)), shard(y2, r, 2)).backward();
  }
  std::vector<std::shared_ptr<nn::Module>> replicas = {start->clone(), start->clone()};
  std::vector<double> local_gap(2);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    DistributedDataParallel ddp(replicas[r], comm);
    {
      auto guard = ddp.no_sync();
      cross_entropy(ddp(shard(mb1, r, 2)), shard(y1, r, 2)).backward();
    }
    local_gap[r] = ddp.parameters()[0].grad().to(kFloat64).sum().item<double>();
    cross_entropy(ddp(shard(mb2, r, 2)), shard(y2, r, 2)).backward();
  }));
  CHECK(local_gap[0] != local_gap[1]);  // inside no_sync the gradients stayed local
  auto want = reference->parameters(), got0 = replicas[0]->parameters(), got1 = replicas[1]->parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(max_abs_diff(got0[i].grad(), want[i].grad() / 2.0) < 1e-12);
    CHECK(max_abs_diff(got1[i].grad(), want[i].grad() / 2.0) < 1e-12);
  }
}

TEST_CASE("a parameter without gradient is an error naming it and suggesting find_unused_parameters") {
  std::vector<std::shared_ptr<TwoHeads>> models = {std::make_shared<TwoHeads>(), std::make_shared<TwoHeads>()};
  Tensor x = randn({2, 4}, kFloat64);
  auto errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    DistributedDataParallel ddp(models[comm->rank()], comm);
    ddp(x).sum().backward();
  });
  for (const std::string& e : errors) {
    CHECK_MESSAGE(contains(e, "2 parameters of the wrapped module received no gradient"), e);
    CHECK(contains(e, "\n  b.weight\n  b.bias"));
    CHECK(contains(e, "find_unused_parameters=true"));
  }
}

TEST_CASE("find_unused_parameters: used somewhere is averaged with zeros; used nowhere keeps its grad") {
  manual_seed(3);
  auto start = std::make_shared<TwoHeads>();
  Tensor x = randn({4, 4}, kFloat64);
  // Rank 0 uses head b, rank 1 does not: b's average is rank 0's gradient / 2.
  std::vector<std::shared_ptr<TwoHeads>> expected, models;
  for (int r = 0; r < 2; ++r) {
    expected.push_back(std::dynamic_pointer_cast<TwoHeads>(start->clone()));
    expected[r]->use_b = r == 0;
    (*expected[r])(shard(x, r, 2)).pow(2).sum().backward();
    models.push_back(std::dynamic_pointer_cast<TwoHeads>(start->clone()));
  }
  std::vector<Tensor> a_grad(2), b_grad(2);
  // char, not bool: std::vector<bool> packs bits, so two rank threads writing [0] and [1]
  // would race on one word (this test was flaky for that reason).
  std::vector<char> b_grad_when_unused(2, 1);
  require_no_errors(run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    models[r]->use_b = r == 0;
    DistributedDataParallel ddp(models[r], comm, {.find_unused_parameters = true});
    ddp(shard(x, r, 2)).pow(2).sum().backward();
    a_grad[r] = models[r]->a->weight.grad().clone();
    b_grad[r] = models[r]->b->weight.grad().clone();
    // A step where no rank uses b: its gradient stays as zero_grad left it (none).
    ddp.zero_grad();
    models[r]->use_b = false;
    ddp(shard(x, r, 2)).sum().backward();
    b_grad_when_unused[r] = models[r]->b->weight.grad().defined();
  }));
  for (int r = 0; r < 2; ++r) {
    CHECK(max_abs_diff(b_grad[r], expected[0]->b->weight.grad() / 2.0) < 1e-12);
    CHECK(max_abs_diff(a_grad[r], (expected[0]->a->weight.grad() + expected[1]->a->weight.grad()) / 2.0) < 1e-12);
    CHECK_FALSE(b_grad_when_unused[r]);
  }
}

TEST_CASE("ranks with different parameter shapes get a clear error naming the parameter, not a hang") {
  auto errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto net = std::make_shared<nn::Linear>(4, comm->rank() == 0 ? 6 : 5);
    DistributedDataParallel ddp(net, comm);
  });
  for (const std::string& e : errors) {
    CHECK_MESSAGE(contains(e, "parameter 0 (\"weight\""), e);
    CHECK(contains(e, "float32 [6, 4] on rank 0"));
    CHECK(contains(e, "float32 [5, 4] on rank 1"));
  }
  auto count_errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
    auto net = std::make_shared<nn::Linear>(4, 4, /*bias=*/comm->rank() == 0);
    DistributedDataParallel ddp(net, comm);
  });
  for (const std::string& e : count_errors) {
    CHECK_MESSAGE(contains(e, "different numbers of parameters"), e);
    CHECK(contains(e, "2 on rank 0"));
    CHECK(contains(e, "1 on rank 1"));
  }
}

TEST_CASE("LOOM_DISTRIBUTED_DEBUG=detail: a bucket mismatch is reported in DDP's words, with every rank's view") {
  for (DebugLevel level : {DebugLevel::Off, DebugLevel::Detail}) {
    CAPTURE(int(level));
    auto errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) {
      std::vector<Tensor> params;
      for (int i = 0; i < 3; ++i) params.push_back(ones({8}, kFloat64).requires_grad_());
      // Rank 0 puts p2 and p1 in its first bucket, rank 1 only p2: the ranks disagree.
      ReducerOptions options{.first_bucket_bytes = comm->rank() == 0 ? 128u : 64u, .bucket_cap_bytes = 1024};
      auto reducer = Reducer::create(params, {"p0", "p1", "p2"}, comm, options,
                                     std::make_shared<Announcer>(*comm, level));
      reducer->prepare_for_backward({});
      (params[0] + params[1] * 2.0 + params[2] * 3.0).sum().backward();
    });
    for (const std::string& e : errors) {
      if (level == DebugLevel::Off) {
        CHECK_MESSAGE(contains(e, "the ranks called different collectives"), e);
      } else {
        CHECK_MESSAGE(contains(e, "the ranks disagree about DDP collective #0"), e);
        CHECK(contains(e, "rank 0: DDP collective #0, iteration 1: all_reduce of bucket 0 (2 parameters: p2 ... p1), "
                          "float64 [16]"));
        CHECK(contains(e, "rank 1: DDP collective #0, iteration 1: all_reduce of bucket 0 (1 parameter: p2), "
                          "float64 [8]"));
      }
    }
  }
}

#endif  // LOOM_WITH_GLOO
