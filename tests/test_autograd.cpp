// The autograd engine's contract: accumulation, ordering, retain_graph, hooks, no_grad,
// detach, and the errors users hit most.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"

using namespace loom;

TEST_CASE("gradients accumulate into leaves across uses and across backward calls") {
  Tensor x = from_vector<double>({1, 2, 3}, {3}).requires_grad_(true);
  CHECK(x.is_leaf());
  Tensor y = (x * x + x * 3.0).sum();  // dy/dx = 2x + 3
  CHECK_FALSE(y.is_leaf());
  CHECK(y.grad_fn() != nullptr);
  y.backward();
  CHECK(x.grad().tolist<double>() == std::vector<double>{5, 7, 9});
  (x * 2.0).sum().backward();  // accumulates, as in PyTorch
  CHECK(x.grad().tolist<double>() == std::vector<double>{7, 9, 11});
  x.set_grad(Tensor());
  (x * 2.0).sum().backward();
  CHECK(x.grad().tolist<double>() == std::vector<double>{2, 2, 2});
}

TEST_CASE("gradients meeting at one tensor are summed without disturbing shared ones") {
  // The engine sums a fresh gradient in place; one that is seen elsewhere must stay intact.
  Tensor x = from_vector<double>({1, 2, 3}, {3}).requires_grad_(true);
  (x + x).sum().backward();  // the same gradient tensor arrives twice
  CHECK(x.grad().tolist<double>() == std::vector<double>{2, 2, 2});
  x.set_grad(Tensor());
  Tensor h = x * 1.0;
  Tensor kept;
  h.register_hook([&](const Tensor& g) {
    kept = g;
    return Tensor();
  });
  Tensor z = h * 2.0 + h * 3.0;  // two gradients for h, then the hook sees their sum
  Tensor seen;
  z.register_hook([&](const Tensor& g) {
    seen = g;  // the root gradient, held here while it flows on
    return Tensor();
  });
  (z + z * 4.0).backward(ones({3}, kFloat64));
  CHECK(seen.tolist<double>() == std::vector<double>{5, 5, 5});
  CHECK(kept.tolist<double>() == std::vector<double>{25, 25, 25});
  CHECK(x.grad().tolist<double>() == std::vector<double>{25, 25, 25});
}

TEST_CASE("a non-scalar root needs a gradient of its shape") {
  Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_(true);
  Tensor y = x * 3.0;
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("one-element outputs"), Error);
  y = x * 3.0;
  CHECK_THROWS_WITH_AS(y.backward(ones({3}, kFloat64)), doctest::Contains("shape [3]"), Error);
  y = x * 3.0;
  y.backward(from_vector<double>({1, 10}, {2}));
  CHECK(x.grad().tolist<double>() == std::vector<double>{3, 30});
}

TEST_CASE("backward twice needs retain_graph") {
  Tensor x = from_vector<double>({2}, {1}).requires_grad_(true);
  Tensor y = (x.exp() * x).sum();
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  CHECK(x.grad().item<double>() == doctest::Approx(2 * (std::exp(2.0) * 3)));
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("backward through the graph a second time"), Error);
}

TEST_CASE("modifying a saved tensor in place is detected at backward") {
  Tensor a = from_vector<double>({1, 2}, {2}).requires_grad_(true);
  Tensor b = from_vector<double>({3, 4}, {2});
  Tensor c = (a * b).sum();  // MulBackward saved b
  b.add_(ones({2}, kFloat64));
  CHECK_THROWS_WITH_AS(c.backward(), doctest::Contains("modified by an in-place operation"), Error);
  Tensor d = (a * b).sum();
  d.backward();  // a fresh graph sees the new values
  CHECK(a.grad().tolist<double>() == std::vector<double>{4, 5});
}

TEST_CASE("no_grad, detach and requires_grad propagation") {
  Tensor x = ones({2}, kFloat64).requires_grad_(true);
  {
    NoGradGuard guard;
    CHECK_FALSE(GradMode::is_enabled());
    Tensor y = x * 2.0;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
  }
  CHECK(GradMode::is_enabled());
  Tensor d = x.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.storage() == x.storage());
  Tensor z = zeros({2}, kFloat64) * 5.0;
  CHECK_FALSE(z.requires_grad());
  CHECK_THROWS_WITH_AS(z.backward(), doctest::Contains("does not require grad"), Error);
  CHECK_THROWS_WITH_AS(zeros({2}, kInt64).requires_grad_(), doctest::Contains("floating-point"), Error);
  Tensor w = x * 2.0;
  CHECK_THROWS_WITH_AS(w.requires_grad_(false), doctest::Contains("leaf"), Error);
}

TEST_CASE("tensor hooks can inspect and replace gradients") {
  Tensor x = from_vector<double>({1, 2}, {2}).requires_grad_(true);
  Tensor h = x * 2.0;
  std::vector<double> seen;
  h.register_hook([&](const Tensor& g) {
    seen = g.tolist<double>();
    return g * 10.0;  // replaces the gradient flowing into h's producer
  });
  (h * 3.0).sum().backward();
  CHECK(seen == std::vector<double>{3, 3});
  CHECK(x.grad().tolist<double>() == std::vector<double>{60, 60});

  Tensor p = from_vector<double>({1}, {1}).requires_grad_(true);
  p.register_hook([](const Tensor& g) { return g * 0.5; });
  (p * 4.0).sum().backward();
  CHECK(p.grad().item<double>() == 2.0);

  // A replacement must keep the gradient's shape, dtype and device, leaf or not.
  Tensor q = from_vector<double>({1, 2, 3}, {3}).requires_grad_(true);
  q.register_hook([](const Tensor&) { return zeros({5}, kFloat64); });
  CHECK_THROWS_WITH_AS((q * 2.0).sum().backward(),
                       doctest::Contains("a gradient hook of a leaf returned a float64 tensor of shape [5]"), Error);
  Tensor r = from_vector<double>({1, 2, 3}, {3}).requires_grad_(true);
  Tensor mid = r * 2.0;
  mid.register_hook([](const Tensor& g) { return g.to(kFloat32); });
  CHECK_THROWS_WITH_AS(mid.sum().backward(), doctest::Contains("returned a float32 tensor of shape [3]"), Error);
}

TEST_CASE("post-accumulate hooks fire once the leaf's gradient is complete, as soon as it is") {
  // Two parameters used in sequence: w2 is used last, so its gradient is complete first.
  Tensor w1 = from_vector<double>({2}, {1}).requires_grad_(true);
  Tensor w2 = from_vector<double>({3}, {1}).requires_grad_(true);
  std::vector<std::string> order;
  std::vector<double> w1_grads;
  w1.register_post_accumulate_grad_hook([&](const Tensor& p) {
    order.push_back("w1");
    w1_grads.push_back(p.grad().item<double>());
  });
  w2.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("w2"); });
  Tensor x = from_vector<double>({1}, {1});
  Tensor h = (x * w1).exp();
  Tensor y = ((h * w2).tanh() + h * w1).sum();  // w1 used twice: its hook fires once, with the full sum
  y.backward();
  REQUIRE(order.size() == 2);
  CHECK(order[0] == "w2");
  CHECK(order[1] == "w1");
  CHECK(w1_grads[0] == doctest::Approx(w1.grad().item<double>()));
  CHECK_THROWS_WITH_AS((w1 * 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}),
                       doctest::Contains("only leaf tensors"), Error);
}

TEST_CASE("queue_callback runs after every gradient, before backward returns; outside backward it is an error") {
  // See Note [Final callbacks]: what the DDP reducer's finalize relies on.
  Tensor w1 = from_vector<double>({2}, {1}).requires_grad_(true);
  Tensor w2 = from_vector<double>({3}, {1}).requires_grad_(true);
  std::vector<std::string> order;
  w2.register_post_accumulate_grad_hook([&](const Tensor&) {
    order.push_back("w2");
    autograd::queue_callback([&] {
      order.push_back(w1.grad().defined() ? "final, w1 has its gradient" : "final, too early");
      autograd::queue_callback([&] { order.push_back("queued by a callback"); });
    });
  });
  w1.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("w1"); });
  ((w1 * 2.0).exp() * w2).sum().backward();  // w2's gradient is complete first, w1's last
  CHECK(order == std::vector<std::string>{"w2", "w1", "final, w1 has its gradient", "queued by a callback"});
  (w1 * 1.0).sum().backward();  // a later backward does not rerun old callbacks
  CHECK(order.size() == 5);
  CHECK_THROWS_WITH_AS(autograd::queue_callback([] {}), doctest::Contains("no backward() is running"), Error);
}

TEST_CASE("gradients flowing into a leaf are never aliased between leaves") {
  // add's backward passes the same gradient tensor to both inputs.
  Tensor a = zeros({2}, kFloat64).requires_grad_(true);
  Tensor b = zeros({2}, kFloat64).requires_grad_(true);
  (a + b).sum().backward();
  CHECK(a.grad().storage() != b.grad().storage());
  {
    NoGradGuard guard;
    a.grad().add_(ones({2}, kFloat64));
  }
  CHECK(b.grad().tolist<double>() == std::vector<double>{1, 1});
}

TEST_CASE("branches that get no gradient are treated as zero") {
  Tensor x = from_vector<double>({1, 2, 3, 4}, {4}).requires_grad_(true);
  auto [values, indices] = max(x.view({2, 2}), 1);
  (void)indices;
  values.sum().backward();
  CHECK(x.grad().tolist<double>() == std::vector<double>{0, 1, 0, 1});
}

TEST_CASE("the engine runs a diamond graph once per node") {
  std::atomic<int> calls{0};
  Tensor x = from_vector<double>({1.5}, {1}).requires_grad_(true);
  Tensor shared = x * 2.0;
  shared.register_hook([&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  Tensor y = (shared.exp() + shared.tanh() + shared * shared).sum();
  y.backward();
  CHECK(calls == 1);
  double s = 3.0;
  double expected = 2 * (std::exp(s) + (1 - std::tanh(s) * std::tanh(s)) + 2 * s);
  CHECK(x.grad().item<double>() == doctest::Approx(expected));
}
