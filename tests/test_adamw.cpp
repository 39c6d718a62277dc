// optim::AdamW against a float64 transcription of PyTorch's update (Note [AdamW update
// rule]), one float32 step against float64 truth, state names and exact resumption,
// param_groups_weight_decay's split, validation, and nn::utils::clip_grad_norm_ with its two
// halves.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "autograd/ops.h"           // defines: cross_entropy, from_vector, randn
#include "nn/embedding.h"           // defines: Embedding
#include "nn/linear.h"              // defines: Linear
#include "nn/optim/adamw.h"         // defines: AdamW, param_groups_weight_decay
#include "nn/optim/clip_grad.h"     // defines: clip_grad_norm_
#include "nn/vision_transformer.h"  // defines: VisionTransformer

using namespace loom;

namespace {

// PyTorch 1.13's torch/optim/adamw.py _single_tensor_adamw for one parameter, element by
// element, in double.
struct ReferenceAdamW {
  optim::AdamWOptions o;
  std::vector<double> m = {}, v = {}, v_max = {};
  int step = 0;
  void update(std::vector<double>& p, const std::vector<double>& g_in) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0), v_max.assign(p.size(), 0);
    ++step;
    const double bc1 = 1 - std::pow(o.beta1, step), bc2_sqrt = std::sqrt(1 - std::pow(o.beta2, step));
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = o.maximize ? -g_in[i] : g_in[i];
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      v_max[i] = std::max(v_max[i], v[i]);
      const double denom = std::sqrt(o.amsgrad ? v_max[i] : v[i]) / bc2_sqrt + o.eps;
      p[i] -= o.lr / bc1 * m[i] / denom;
    }
  }
};

std::vector<double> values(int64_t n, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  auto v = randn({n}, kFloat64, &gen).tolist<double>();
  for (double& x : v) x *= scale;
  return v;
}

Tensor param(const std::vector<double>& v, DType dtype = kFloat64) {
  return from_vector(v, {static_cast<int64_t>(v.size())}).to(dtype).requires_grad_(true);
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_CASE("AdamW follows PyTorch's update rule step by step: weight decay, amsgrad, maximize") {
  const optim::AdamWOptions variants[] = {
      {},
      {.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1},
      {.lr = 0.003, .weight_decay = 0.05, .amsgrad = true},
      {.lr = 0.002, .weight_decay = 0.0, .maximize = true},
  };
  for (const optim::AdamWOptions& o : variants) {
    CAPTURE(o.lr);
    std::vector<double> p = values(50, 1);
    Tensor t = param(p);
    optim::AdamW opt({t}, o);
    ReferenceAdamW ref{o};
    for (int s = 0; s < 6; ++s) {
      // Gradients that shrink, so that amsgrad's maximum differs from exp_avg_sq.
      const std::vector<double> g = values(50, 10 + static_cast<uint64_t>(s), 1.0 / (1 + s));
      t.set_grad(from_vector(g, {50}));
      opt.step();
      ref.update(p, g);
      CHECK(max_abs_diff(t.tolist<double>(), p) < 1e-14);
    }
  }
}

TEST_CASE("one float32 AdamW step is within float32 rounding of the float64 truth") {
  const int64_t n = 10000;
  std::vector<double> p64 = values(n, 2, 0.05), g = values(n, 3, 1e-3);
  Tensor p32 = param(p64, kFloat32);
  // float32 inputs are the truth's inputs too.
  p64 = widen(p32.tolist<float>());
  Tensor g32 = from_vector(g, {n}).to(kFloat32);
  g = widen(g32.tolist<float>());
  const optim::AdamWOptions o{.lr = 1e-3, .weight_decay = 0.05};
  optim::AdamW opt({p32}, o);
  p32.set_grad(g32);
  opt.step();
  ReferenceAdamW ref{o};
  ref.update(p64, g);
  // The first step moves every weight by about lr; its error is that of a few float32
  // roundings of values around 0.05 (ulp 3.7e-9).
  const double err = max_abs_diff(widen(p32.tolist<float>()), p64);
  MESSAGE("AdamW float32 step: max |loom - float64 truth| = ", err);
  CHECK(err < 2e-8);
}

TEST_CASE("AdamW's state_dict has PyTorch's state names and resumes exactly") {
  auto run = [](int steps, optim::AdamW& opt, const Tensor& p, int first) {
    for (int s = first; s < first + steps; ++s) {
      p.set_grad(from_vector(values(8, 20 + static_cast<uint64_t>(s)), {8}));
      opt.step();
    }
  };
  Tensor a = param(values(8, 4)), b = param(values(8, 4));
  optim::AdamW straight({a}, {.lr = 0.01, .amsgrad = true});
  run(5, straight, a, 0);
  optim::AdamW first({b}, {.lr = 0.01, .amsgrad = true});
  run(3, first, b, 0);
  auto state = first.state_dict();
  CHECK(state.contains("state.0.step"));
  CHECK(state["state.0.step"].dim() == 0);
  CHECK(state["state.0.step"].item<float>() == 3);
  CHECK(state.contains("state.0.exp_avg"));
  CHECK(state.contains("state.0.exp_avg_sq"));
  CHECK(state.contains("state.0.max_exp_avg_sq"));
  CHECK(state["param_groups.0.beta2"].item<double>() == 0.999);
  optim::AdamW resumed({b}, {.lr = 0.5});
  resumed.load_state_dict(state);
  CHECK(resumed.param_groups()[0]["lr"] == 0.01);
  run(2, resumed, b, 3);
  CHECK(a.tolist<double>() == b.tolist<double>());
}

TEST_CASE("param_groups_weight_decay: no decay on biases, norms, embeddings, cls_token and pos_embed") {
  auto vit = std::make_shared<nn::VisionTransformer>(nn::VisionTransformerOptions{
      .image_size = 8, .patch_size = 4, .num_layers = 1, .num_heads = 2, .hidden_dim = 4, .mlp_dim = 8});
  auto groups = optim::param_groups_weight_decay(*vit, 0.05, vit->no_weight_decay());
  REQUIRE(groups.size() == 2);
  CHECK(groups[0]["weight_decay"] == 0);
  CHECK(groups[1]["weight_decay"] == 0.05);
  // Decayed: patch_embed.weight, q/k/v/out_proj weights, linear1/linear2 weights, head.weight.
  CHECK(groups[1].params.size() == 1 + 4 + 2 + 1);
  CHECK(groups[0].params.size() + groups[1].params.size() == vit->parameters().size());
  for (const Tensor& p : groups[1].params) CHECK(p.dim() >= 2);
  bool pos_exempt = false;
  for (const Tensor& p : groups[0].params) pos_exempt = pos_exempt || p.is_same(vit->pos_embed);
  CHECK(pos_exempt);

  struct Tagger : nn::Cloneable<Tagger> {
    Tagger() : Cloneable("Tagger") { reset(); }
    void reset() override {
      embed = register_module("embed", std::make_shared<nn::Embedding>(10, 4));
      fc = register_module("fc", std::make_shared<nn::Linear>(4, 2));
    }
    std::shared_ptr<nn::Embedding> embed;
    std::shared_ptr<nn::Linear> fc;
  };
  Tagger tagger;
  auto tg = optim::param_groups_weight_decay(tagger, 0.1);
  REQUIRE(tg.size() == 2);
  CHECK(tg[0].params.size() == 2);  // embed.weight, fc.bias
  CHECK(tg[1].params.size() == 1);
  CHECK(tg[1].params[0].is_same(tagger.fc->weight));
  optim::AdamW opt(tg, {.lr = 1e-3, .weight_decay = 0.1});
  CHECK(opt.param_groups()[0]["weight_decay"] == 0);
}

TEST_CASE("AdamW refuses bad hyperparameters with PyTorch's messages") {
  Tensor p = param({1.0, 2.0});
  CHECK_THROWS_WITH_AS(optim::AdamW({p}, {.beta1 = 1.0}), doctest::Contains("invalid beta parameter at index 0"), Error);
  CHECK_THROWS_WITH_AS(optim::AdamW({p}, {.beta2 = -0.1}), doctest::Contains("invalid beta parameter at index 1"),
                       Error);
  CHECK_THROWS_WITH_AS(optim::AdamW({p}, {.lr = -1}), doctest::Contains("invalid learning rate"), Error);
  CHECK_THROWS_WITH_AS(optim::AdamW({p}, {.eps = -1}), doctest::Contains("invalid epsilon"), Error);
}

TEST_CASE("clip_grad_norm_: the total norm, gradients scaled to max_norm, small ones untouched") {
  Tensor a = param({3.0, 0.0}), b = param({0.0, 4.0}), c = param({1.0});
  a.set_grad(from_vector<double>({3, 0}, {2}));
  b.set_grad(from_vector<double>({0, 4}, {2}));  // c has no gradient: skipped
  Tensor total = nn::utils::clip_grad_norm_({a, b, c}, 1.0);
  CHECK(total.item<double>() == doctest::Approx(5.0));
  const double coef = 1.0 / (5.0 + 1e-6);
  CHECK(a.grad().tolist<double>()[0] == doctest::Approx(3 * coef).epsilon(1e-14));
  CHECK(b.grad().tolist<double>()[1] == doctest::Approx(4 * coef).epsilon(1e-14));
  // Within the bound: multiplied by exactly 1.
  Tensor again = nn::utils::clip_grad_norm_({a, b}, 10.0);
  CHECK(again.item<double>() == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(a.grad().tolist<double>()[0] == 3 * coef);
  // The infinity norm and the 1-norm.
  a.set_grad(from_vector<double>({-7, 1}, {2}));
  CHECK(nn::utils::clip_grad_norm_({a, b}, 100.0, std::numeric_limits<double>::infinity()).item<double>() == 7);
  CHECK(nn::utils::clip_grad_norm_({a, b}, 100.0, 1.0).item<double>() == doctest::Approx(8 + 4 * coef));
  a.set_grad(from_vector<double>({std::numeric_limits<double>::infinity(), 1}, {2}));
  CHECK_THROWS_WITH_AS(nn::utils::clip_grad_norm_({a, b}, 1.0, 2.0, true), doctest::Contains("non-finite"), Error);
}

TEST_CASE("clip_grad_norm_ is get_total_norm then clip_grads_with_norm_: shards clip by the whole model's norm") {
  // Two ranks' shards of one gradient vector (Note [Clipping sharded gradients]): the p-th
  // powers of their local norms add up to the whole norm's.
  Tensor whole = param({1.0, 2.0, 3.0, 4.0}), left = param({1.0, 2.0}), right = param({3.0, 4.0});
  whole.set_grad(from_vector<double>({1, -2, 3, -4}, {4}));
  left.set_grad(from_vector<double>({1, -2}, {2}));
  right.set_grad(from_vector<double>({3, -4}, {2}));
  const Tensor want = nn::utils::clip_grad_norm_({whole}, 1.0);
  const double l = nn::utils::get_total_norm({left.grad()}).item<double>();
  const double r = nn::utils::get_total_norm({right.grad()}).item<double>();
  const Tensor total = scalar_tensor(std::sqrt(l * l + r * r), kFloat64);
  CHECK(total.item<double>() == doctest::Approx(want.item<double>()).epsilon(1e-15));
  nn::utils::clip_grads_with_norm_({left}, 1.0, total);
  nn::utils::clip_grads_with_norm_({right}, 1.0, total);
  auto w = whole.grad().tolist<double>(), lg = left.grad().tolist<double>(), rg = right.grad().tolist<double>();
  CHECK(lg[1] == doctest::Approx(w[1]).epsilon(1e-15));
  CHECK(rg[0] == doctest::Approx(w[2]).epsilon(1e-15));
  CHECK(nn::utils::get_total_norm({}).item<float>() == 0);
}

TEST_CASE("a small ViT learns a fixed batch under AdamW with clipping") {
  manual_seed(1);
  auto vit = std::make_shared<nn::VisionTransformer>(nn::VisionTransformerOptions{
      .image_size = 8, .patch_size = 4, .num_layers = 2, .num_heads = 2, .hidden_dim = 16, .mlp_dim = 32});
  optim::AdamW opt(optim::param_groups_weight_decay(*vit, 0.05, vit->no_weight_decay()), {.lr = 3e-3});
  Tensor images = randn({16, 3, 8, 8}), labels = randint(0, 10, {16});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy((*vit)(images), labels);
    loss.backward();
    nn::utils::clip_grad_norm_(vit->parameters(), 1.0);
    opt.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  MESSAGE("loss ", first, " -> ", last);
  CHECK(last < 0.5 * first);
}
