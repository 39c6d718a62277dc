// demo_mlp: the smallest complete training loop in loom.
//
// A two-layer perceptron learns y = sin(3x) * x on [-1, 1] with plain SGD, written out
// by hand so every piece is visible: parameters are leaf tensors that require grad,
// the forward pass records a graph, backward() fills .grad(), and the update runs
// under NoGradGuard. (nn::Module and optim::SGD package exactly these steps.)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: linear, tanh, mean, the Tensor math
#include "core/error.h"          // defines: LOOM_CHECK

using namespace loom;

// `demo_mlp [--max-steps N]`, as the other small programs and train_cifar10 take it; any
// other argument is one error line (exit status 1), never a silent run of some other length.
static int parse_steps(int argc, char** argv) {
  int steps = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    LOOM_CHECK(arg == "--max-steps", "unexpected argument '", arg, "'; the one flag is --max-steps N");
    LOOM_CHECK(i + 1 < argc, "--max-steps: expected N SGD steps (1 to 1000000) after it, got nothing");
    char* end = nullptr;
    const long value = std::strtol(argv[++i], &end, 10);
    LOOM_CHECK(*argv[i] != '\0' && *end == '\0' && value >= 1 && value <= 1000000,
               "--max-steps: expected 1 to 1000000 SGD steps (default 2000), got '", argv[i], "'");
    steps = static_cast<int>(value);
  }
  return steps;
}

int main(int argc, char** argv) try {
  const int steps = parse_steps(argc, argv);
  const int64_t batch = 256, hidden = 64;
  Generator gen(0);

  // PyTorch's default Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  auto uniform = [&](Shape shape, double bound) {
    return (rand(shape, kFloat32, &gen) * (2 * bound) - bound).detach().requires_grad_(true);
  };
  Tensor w1 = uniform({hidden, 1}, 1.0), b1 = uniform({hidden}, 1.0);
  Tensor w2 = uniform({1, hidden}, 1 / std::sqrt(double(hidden))), b2 = uniform({1}, 1 / std::sqrt(double(hidden)));
  std::vector<Tensor> params = {w1, b1, w2, b2};
  const double lr = 0.1;

  std::printf("demo_mlp: fitting y = sin(3x) * x with a %lld-unit MLP, %d SGD steps\n",
              static_cast<long long>(hidden), steps);
  for (int step = 1; step <= steps; ++step) {
    Tensor x = rand({batch, 1}, kFloat32, &gen) * 2.0 - 1.0;
    // sin is not a loom op: the target is computed on the host.
    std::vector<float> targets = x.tolist<float>();
    for (float& v : targets) v = std::sin(3 * v) * v;
    Tensor y = from_vector(targets, x.shape());
    Tensor prediction = linear(linear(x, w1, b1).tanh(), w2, b2);
    Tensor loss = ((prediction - y) * (prediction - y)).mean();
    loss.backward();
    {
      NoGradGuard no_grad;
      for (Tensor& p : params) {
        p.add_(p.grad(), -lr);
        p.set_grad(Tensor());
      }
    }
    if (step == 1 || step % (steps / 10 > 0 ? steps / 10 : 1) == 0)
      std::printf("step %5d  loss %.5f\n", step, loss.item<float>());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "demo_mlp: error: %s\n", e.what());
  return 1;
}
