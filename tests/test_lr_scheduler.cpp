// LR schedulers: lr sequences against the formulas PyTorch documents (closed forms, see
// Note [Closed-form schedules]) and values worked by hand, the optimizer's lr following
// along, OneCycleLR's momentum, SequentialLR switching, and state_dict resumption.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "nn/nn.h"

using namespace loom;

namespace {

constexpr double kPi = std::numbers::pi;

struct Fixture {
  Tensor p = zeros({1}).requires_grad_(true);
  optim::SGD opt{std::vector<Tensor>{p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9}};
};

// lr after construction, then after each of `steps` step() calls.
std::vector<double> run(optim::LRScheduler& s, int steps) {
  std::vector<double> lrs = {s.get_last_lr()[0]};
  for (int i = 0; i < steps; ++i) {
    s.step();
    lrs.push_back(s.get_last_lr()[0]);
  }
  return lrs;
}

void check_seq(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK_MESSAGE(got[i] == doctest::Approx(want[i]).epsilon(1e-12), "step ", i);
}

}  // namespace

TEST_CASE("StepLR and MultiStepLR decay by gamma at the right epochs") {
  Fixture f;
  optim::StepLR step(f.opt, 3, 0.5);
  check_seq(run(step, 7), {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025});
  CHECK(f.opt.param_groups()[0]["lr"] == doctest::Approx(0.025));

  Fixture g;
  optim::MultiStepLR multi(g.opt, {4, 2, 4}, 0.1);  // unsorted, and 4 twice: decays by 0.01 there
  check_seq(run(multi, 5), {0.1, 0.1, 0.01, 0.01, 1e-4, 1e-4});
}

TEST_CASE("CosineAnnealingLR follows eta_min + (base - eta_min)(1 + cos(pi t / T_max)) / 2") {
  Fixture f;
  optim::CosineAnnealingLR cos(f.opt, 10, 0.001);
  auto lrs = run(cos, 12);
  for (int t = 0; t <= 12; ++t)
    CHECK(lrs[t] == doctest::Approx(0.001 + 0.099 * (1 + std::cos(kPi * t / 10)) / 2).epsilon(1e-12));
  CHECK(lrs[5] == doctest::Approx(0.0505));  // halfway: the mean of base and eta_min
  CHECK(lrs[10] == doctest::Approx(0.001));
}

TEST_CASE("LinearLR warms up from start_factor to end_factor over total_iters") {
  Fixture f;
  CHECK(f.opt.param_groups()[0]["lr"] == 0.1);
  optim::LinearLR warm(f.opt, 0.25, 1.0, 3);
  CHECK(f.opt.param_groups()[0]["lr"] == doctest::Approx(0.025));  // applied at construction
  check_seq(run(warm, 4), {0.025, 0.05, 0.075, 0.1, 0.1});
}

TEST_CASE("SequentialLR: warm-up, then cosine restarted at its epoch 0") {
  Fixture f;
  auto warm = std::make_shared<optim::LinearLR>(f.opt, 0.5, 1.0, 2);
  auto cos = std::make_shared<optim::CosineAnnealingLR>(f.opt, 4);
  CHECK(cos->base_lrs()[0] == 0.1);  // initial_lr, not the warm-up's scaled lr
  optim::SequentialLR seq(f.opt, {warm, cos}, {2});
  auto lrs = run(seq, 6);
  check_seq(lrs, {0.05, 0.075, 0.1, 0.1 * (1 + std::cos(kPi / 4)) / 2, 0.05, 0.1 * (1 + std::cos(3 * kPi / 4)) / 2,
                  0.0});
  CHECK_THROWS_WITH_AS(optim::SequentialLR(f.opt, {warm, cos}, {}), doctest::Contains("expected 1 milestones"), Error);
}

TEST_CASE("OneCycleLR with PyTorch's defaults, at a few steps, with momentum cycling") {
  Fixture f;
  const int64_t total = 100;
  optim::OneCycleLR one(f.opt, 0.1, total);
  const double initial = 0.1 / 25, min_lr = initial / 1e4;
  auto cos_anneal = [](double start, double end, double pct) { return end + (start - end) / 2 * (std::cos(kPi * pct) + 1); };
  // Phase 1 ends at step pct_start * total - 1 = 29; phase 2 at total - 1 = 99.
  CHECK(one.get_last_lr()[0] == doctest::Approx(initial));
  CHECK(f.opt.param_groups()[0]["momentum"] == doctest::Approx(0.95));
  auto lrs = run(one, 100);
  CHECK(lrs[10] == doctest::Approx(cos_anneal(initial, 0.1, 10.0 / 29)));
  CHECK(lrs[29] == doctest::Approx(0.1));
  CHECK(lrs[64] == doctest::Approx(cos_anneal(0.1, min_lr, 35.0 / 70)));
  CHECK(lrs[99] == doctest::Approx(min_lr));
  CHECK(lrs[100] == doctest::Approx(cos_anneal(0.1, min_lr, 71.0 / 70)));  // PyTorch allows step == total_steps
  CHECK(one.momentum_at(29) == doctest::Approx(0.85));
  CHECK(one.momentum_at(64) == doctest::Approx(0.90));
  CHECK(f.opt.param_groups()[0]["momentum"] == doctest::Approx(cos_anneal(0.85, 0.95, 71.0 / 70)));
  CHECK_THROWS_WITH_AS(one.step(), doctest::Contains("total steps is 100"), Error);

  // Worked by hand: halfway through phase 1 of a linear schedule.
  Fixture g;
  optim::OneCycleLR lin(g.opt, 1.0, 21, {.pct_start = 0.5, .anneal_strategy = "linear", .cycle_momentum = false,
                                         .div_factor = 10, .final_div_factor = 100});
  auto l = run(lin, 21);  // phase 1: steps 0..9.5, from 0.1 to 1.0; phase 2: 9.5..20, to 0.001
  CHECK(l[0] == doctest::Approx(0.1));
  CHECK(l[5] == doctest::Approx(0.1 + 0.9 * 5 / 9.5));
  CHECK(l[20] == doctest::Approx(0.001));
  CHECK(g.opt.param_groups()[0]["momentum"] == 0.9);  // not cycled
}

TEST_CASE("OneCycleLR three_phase goes up, back down to the initial lr, then anneals") {
  Fixture f;
  optim::OneCycleLR one(f.opt, 0.1, 100, {.three_phase = true});
  auto lrs = run(one, 99);
  // Phases end at 29, 58 and 99.
  CHECK(lrs[29] == doctest::Approx(0.1));
  CHECK(lrs[58] == doctest::Approx(0.004));
  CHECK(lrs[99] == doctest::Approx(0.004 / 1e4));
  CHECK(one.momentum_at(58) == doctest::Approx(0.95));
  CHECK(one.momentum_at(80) == doctest::Approx(0.95));
}

TEST_CASE("scheduler state_dict resumes the schedule exactly") {
  Fixture f;
  optim::CosineAnnealingLR first(f.opt, 20);
  for (int i = 0; i < 7; ++i) first.step();
  auto state = first.state_dict();
  CHECK(state["last_epoch"].item<int64_t>() == 7);

  Fixture g;
  optim::CosineAnnealingLR second(g.opt, 20);
  second.load_state_dict(state);
  CHECK(second.last_epoch() == 7);
  CHECK(g.opt.param_groups()[0]["lr"] == f.opt.param_groups()[0]["lr"]);
  first.step();
  second.step();
  CHECK(second.get_last_lr() == first.get_last_lr());
}

TEST_CASE("schedules set every param group from its own base lr") {
  Tensor a = zeros({1}).requires_grad_(true), b = zeros({1}).requires_grad_(true);
  optim::SGD opt({{{a}, {}}, {{b}, {{"lr", 1.0}}}}, {.lr = 0.1});
  optim::StepLR step(opt, 1, 0.5);
  step.step();
  CHECK(step.get_last_lr() == std::vector<double>{0.05, 0.5});
  optim::OneCycleLR one(opt, std::vector<double>{0.2, 2.0}, 10);
  CHECK(one.get_last_lr()[0] == doctest::Approx(0.2 / 25));
  CHECK(one.get_last_lr()[1] == doctest::Approx(2.0 / 25));
}

TEST_CASE("scale_lr_linear: the linear scaling rule") {
  CHECK(optim::scale_lr_linear(0.1, 8) == doctest::Approx(0.8));
  CHECK(optim::scale_lr_linear(0.1, 1) == 0.1);
  CHECK_THROWS_AS(optim::scale_lr_linear(0.1, 0), Error);
}
