// Independent graphs on independent threads: grad mode is thread-local and the engine
// keeps its state per call, so concurrent training steps must not interfere.
#include <doctest/doctest.h>

#include <thread>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

using namespace loom;

namespace {

// A small model step: a few layers of elementwise math and reductions on `seed` data.
std::vector<double> run_step(uint64_t seed, int repeats) {
  Generator gen(seed);
  Tensor w = randn({64, 32}, kFloat64, &gen).requires_grad_(true);
  Tensor b = randn({32}, kFloat64, &gen).requires_grad_(true);
  for (int r = 0; r < repeats; ++r) {
    Tensor x = randn({64, 32}, kFloat64, &gen);
    Tensor h = (x * w + b).tanh();
    Tensor loss = (h * h).mean({1}).sum() + (h.exp().sum({0}) * b).sum();
    loss.backward();
  }
  auto out = w.grad().tolist<double>();
  auto gb = b.grad().tolist<double>();
  out.insert(out.end(), gb.begin(), gb.end());
  return out;
}

}  // namespace

TEST_CASE("two threads back-propagating independent graphs match sequential runs") {
  const int repeats = 40;
  auto expected_a = run_step(1, repeats);
  auto expected_b = run_step(2, repeats);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<double> got_a, got_b;
    std::thread ta([&] { got_a = run_step(1, repeats); });
    std::thread tb([&] { got_b = run_step(2, repeats); });
    ta.join();
    tb.join();
    CHECK(got_a == expected_a);  // bit-identical: same ops in the same order
    CHECK(got_b == expected_b);
  }
}

TEST_CASE("grad mode is per thread") {
  NoGradGuard no_grad;
  bool other_thread_enabled = false;
  std::thread t([&] { other_thread_enabled = GradMode::is_enabled(); });
  t.join();
  CHECK(other_thread_enabled);
  CHECK_FALSE(GradMode::is_enabled());
}

TEST_CASE("concurrent backward into a shared leaf accumulates every contribution") {
  // DP replicas and pipeline micro-batches may deliver gradients to the same leaf from
  // several threads; AccumulateGrad serialises them with the leaf's mutex.
  Tensor w = ones({1000}, kFloat64).requires_grad_(true);
  const int threads = 4, steps = 25;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int s = 0; s < steps; ++s) (w * 2.0).sum().backward();
    });
  }
  for (auto& t : pool) t.join();
  auto grad = w.grad().tolist<double>();
  for (double g : grad) CHECK(g == 2.0 * threads * steps);
}
