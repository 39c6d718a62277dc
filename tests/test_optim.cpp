// optim::SGD: single steps against numbers worked by hand, several steps against a scalar
// transcription of PyTorch's update (Note [SGD update rule]), param groups, skipped
// parameters, validation, and exact resumption from state_dict.
#include <doctest/doctest.h>

#include <cmath>

#include "nn/nn.h"

using namespace loom;

namespace {

// PyTorch's torch/optim/sgd.py _single_tensor_sgd for one parameter, element by element,
// in double: the reference the fused kernel must reproduce.
struct ReferenceSGD {
  optim::SGDOptions o;
  std::vector<double> buf;
  void step(std::vector<double>& p, const std::vector<double>& g) {
    const bool first = buf.empty();
    if (o.momentum != 0 && first) buf.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      double d = o.maximize ? -g[i] : g[i];
      if (o.weight_decay != 0) d = d + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = first ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] = p[i] - o.lr * d;
    }
  }
};

Tensor param(std::vector<double> values) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).requires_grad_(true);
}

void set_grad(const Tensor& p, std::vector<double> g) { p.set_grad(from_vector(g, p.shape())); }

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK_MESSAGE(std::abs(got[i] - want[i]) <= tol, "element ", i, ": ",
                                                        got[i], " vs ", want[i]);
}

std::vector<double> values(const Tensor& p) { return p.detach().tolist<double>(); }

}  // namespace

TEST_CASE("SGD single steps worked by hand") {
  SUBCASE("plain: p - lr * g") {
    Tensor p = param({1.0, -2.0});
    optim::SGD opt({p}, 0.1);
    set_grad(p, {0.5, 1.0});
    opt.step();
    check_close(values(p), {0.95, -2.1});
  }
  SUBCASE("weight decay: p - lr * (g + wd * p)") {
    Tensor p = param({1.0, -2.0});
    optim::SGD opt({p}, {.lr = 0.1, .weight_decay = 0.01});
    set_grad(p, {0.5, 1.0});
    opt.step();
    check_close(values(p), {1.0 - 0.1 * 0.51, -2.0 - 0.1 * 0.98});
  }
  SUBCASE("momentum: the first buffer is d_p, then m * buf + (1 - dampening) * d_p") {
    Tensor p = param({1.0});
    optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
    set_grad(p, {1.0});
    opt.step();  // buf = 1 (no dampening on the first step): p = 1 - 0.1
    check_close(values(p), {0.9});
    set_grad(p, {2.0});
    opt.step();  // buf = 0.9 * 1 + 0.5 * 2 = 1.9: p = 0.9 - 0.19
    check_close(values(p), {0.71});
  }
  SUBCASE("nesterov: d_p + m * buf") {
    Tensor p = param({1.0});
    optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
    set_grad(p, {1.0});
    opt.step();  // buf = 1, d = 1 + 0.9 = 1.9
    check_close(values(p), {1.0 - 0.19});
    set_grad(p, {1.0});
    opt.step();  // buf = 0.9 + 1 = 1.9, d = 1 + 1.71 = 2.71
    check_close(values(p), {0.81 - 0.271});
  }
  SUBCASE("maximize ascends") {
    Tensor p = param({1.0});
    optim::SGD opt({p}, {.lr = 0.5, .maximize = true});
    set_grad(p, {2.0});
    opt.step();
    check_close(values(p), {2.0});
  }
}

TEST_CASE("SGD matches PyTorch's rule over many steps for every option combination") {
  Generator gen(42);
  for (double momentum : {0.0, 0.9})
    for (double dampening : {0.0, 0.3})
      for (double wd : {0.0, 5e-4})
        for (bool nesterov : {false, true}) {
          if (nesterov && (momentum == 0 || dampening != 0)) continue;
          optim::SGDOptions o{.lr = 0.05, .momentum = momentum, .dampening = dampening, .weight_decay = wd,
                              .nesterov = nesterov};
          // Big enough for the OpenMP path of the fused loop.
          const int64_t n = 40000;
          Tensor p = randn({n}, kFloat64, &gen).requires_grad_(true);
          std::vector<double> ref = values(p);
          ReferenceSGD reference{o, {}};
          optim::SGD opt({p}, o);
          for (int step = 0; step < 4; ++step) {
            Tensor g = randn({n}, kFloat64, &gen);
            p.set_grad(g);
            opt.step();
            reference.step(ref, g.tolist<double>());
          }
          auto got = values(p);
          double worst = 0;
          for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - ref[i]));
          CHECK_MESSAGE(worst < 1e-12, "momentum ", momentum, " dampening ", dampening, " wd ", wd, " nesterov ",
                        nesterov);
        }
}

TEST_CASE("SGD on float32 parameters") {
  Tensor p = from_vector<float>({1.0f, 2.0f}, {2}).requires_grad_(true);
  optim::SGD opt({p}, {.lr = 0.5, .momentum = 0.5});
  p.set_grad(from_vector<float>({1.0f, 1.0f}, {2}));
  opt.step();
  opt.step();  // buf = 0.5 + 1 = 1.5
  CHECK(p.detach().tolist<float>() == std::vector<float>{-0.25f, 0.75f});
}

TEST_CASE("SGD skips parameters without gradients and zero_grad clears them") {
  Tensor a = param({1.0}), b = param({1.0});
  optim::SGD opt({a, b}, {.lr = 1.0, .momentum = 0.9});
  set_grad(a, {1.0});
  opt.step();
  check_close(values(a), {0.0});
  check_close(values(b), {1.0});
  CHECK(opt.state_dict().contains("state.0.momentum_buffer"));
  CHECK_FALSE(opt.state_dict().contains("state.1.momentum_buffer"));  // no step, no state
  opt.zero_grad(/*set_to_none=*/false);
  CHECK(a.grad().tolist<double>() == std::vector<double>{0.0});
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("param groups take their own options, defaults fill the rest") {
  Tensor a = param({1.0}), b = param({1.0});
  optim::SGD opt({{{a}, {}}, {{b}, {{"lr", 0.5}}}}, {.lr = 0.1});
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.step();
  check_close(values(a), {0.9});
  check_close(values(b), {0.5});
  CHECK(opt.param_groups()[1]["momentum"] == 0.0);
  opt.param_groups()[0]["lr"] = 1.0;  // as a scheduler does
  opt.step();
  check_close(values(a), {-0.1});
  CHECK_THROWS_WITH_AS(opt.param_groups()[0]["betas"], doctest::Contains("lr"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({{{a}, {{"betas", 0.9}}}}, {}), doctest::Contains("unknown hyperparameter"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({a, a}, 0.1), doctest::Contains("already appears"), Error);
}

TEST_CASE("SGD validates its hyperparameters as PyTorch does") {
  Tensor p = param({1.0});
  CHECK_THROWS_WITH_AS(optim::SGD({p}, {.lr = 0.1, .nesterov = true}), doctest::Contains("Nesterov"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                       doctest::Contains("zero dampening"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({p}, -1.0), doctest::Contains("learning rate"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD(std::vector<Tensor>{}, 0.1), doctest::Contains("empty parameter list"), Error);
  Tensor non_leaf = p * 2.0;
  CHECK_THROWS_WITH_AS(optim::SGD({non_leaf}, 0.1), doctest::Contains("non-leaf"), Error);
}

TEST_CASE("state_dict round trip (through a safetensors buffer) resumes with identical steps") {
  Generator gen(5);
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-3};
  Tensor a1 = randn({3, 2}, kFloat64, &gen).requires_grad_(true), b1 = randn({4}, kFloat64, &gen).requires_grad_(true);
  optim::SGD first({{{a1}, {}}, {{b1}, {{"lr", 0.01}}}}, o);
  std::vector<std::pair<Tensor, Tensor>> grads;
  for (int i = 0; i < 5; ++i) grads.emplace_back(randn({3, 2}, kFloat64, &gen), randn({4}, kFloat64, &gen));
  for (int i = 0; i < 3; ++i) {
    a1.set_grad(grads[i].first);
    b1.set_grad(grads[i].second);
    first.step();
  }
  first.param_groups()[1]["lr"] = 0.02;

  // The "restarted process": new parameters with the saved values, a fresh optimizer
  // built with different hyperparameters, then load_state_dict.
  Tensor a2 = a1.detach().clone().requires_grad_(true), b2 = b1.detach().clone().requires_grad_(true);
  optim::SGD second({{{a2}, {}}, {{b2}, {}}}, {.lr = 7.0});
  auto saved = safetensors::deserialize(safetensors::serialize(first.state_dict()), "optimizer state").tensors;
  CHECK(saved.contains("param_groups.1.lr"));
  CHECK(saved.contains("state.1.momentum_buffer"));
  CHECK(saved["param_groups.1.params"].tolist<int64_t>() == std::vector<int64_t>{1});
  second.load_state_dict(saved);
  CHECK(second.param_groups()[1]["lr"] == 0.02);
  CHECK(second.param_groups()[0]["momentum"] == 0.9);
  for (int i = 3; i < 5; ++i) {
    a1.set_grad(grads[i].first);
    b1.set_grad(grads[i].second);
    first.step();
    a2.set_grad(grads[i].first);
    b2.set_grad(grads[i].second);
    second.step();
  }
  CHECK(values(a1.flatten()) == values(a2.flatten()));
  CHECK(values(b1) == values(b2));

  optim::SGD one_group({a2, b2}, 0.1);
  CHECK_THROWS_WITH_AS(one_group.load_state_dict(saved), doctest::Contains("has 2 parameters but the saved group had 1"),
                       Error);
}

TEST_CASE("the optimizer follows parameters that Module::to moved after it was built") {
  auto fc = std::make_shared<nn::Linear>(3, 2);
  optim::SGD opt(fc->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (const Tensor& p : fc->parameters()) p.set_grad(ones_like(p));
  opt.step();
  fc->to(kFloat64);  // parameters keep their identity (Note [Parameters keep their identity])
  for (const Tensor& p : fc->parameters()) p.set_grad(ones_like(p));
  opt.step();
  CHECK(fc->weight.dtype() == kFloat64);
}

TEST_CASE("model_state_bytes: parameters, gradients and optimizer state, each storage once; released storage is 0") {
  auto fc = std::make_shared<nn::Linear>(3, 2);  // float32: 6 + 2 elements
  optim::SGD opt(fc->parameters(), {.lr = 0.1, .momentum = 0.9});
  CHECK(nn::model_state_bytes(*fc, opt) == 8 * 4);  // no gradients, no state yet
  for (const Tensor& p : fc->parameters()) p.set_grad(ones_like(p));
  CHECK(nn::model_state_bytes(*fc) == 2 * 8 * 4);
  opt.step();
  CHECK(opt.state_tensors().size() == 2);
  CHECK(nn::model_state_bytes(*fc, opt) == 3 * 8 * 4);  // + momentum buffers
  // Gradients as views into one flat buffer (DDP's gradient_as_bucket_view): one storage,
  // counted once at its full size.
  Tensor flat = zeros({10});
  fc->weight.set_grad(flat.narrow(0, 0, 6).view({2, 3}));
  fc->bias.set_grad(flat.narrow(0, 6, 2));
  CHECK(nn::model_state_bytes(*fc, opt) == 8 * 4 + 10 * 4 + 8 * 4);
  // A parameter whose storage was released (FSDP frees gathered parameters) counts 0.
  fc->zero_grad();
  nn::set_data(fc->weight, empty({0}));
  CHECK(nn::model_state_bytes(*fc) == 2 * 4);
}
