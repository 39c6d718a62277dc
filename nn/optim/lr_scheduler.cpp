#include "nn/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/factory.h"

namespace loom::optim {

// ---- LRScheduler --------------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (ParamGroup& group : optimizer_.param_groups()) {
    // See the header: the first scheduler records the optimizer's lr as initial_lr.
    if (!group.has("initial_lr")) group.options["initial_lr"] = group["lr"];
    base_lrs_.push_back(group["initial_lr"]);
  }
}

void LRScheduler::step() {
  ++last_epoch_;
  apply(last_epoch_);
}

void LRScheduler::apply(int64_t epoch) {
  last_lr_.clear();
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g]["lr"] = lr_at(g, epoch);
    last_lr_.push_back(groups[g]["lr"]);
  }
}

OrderedDict<Tensor> LRScheduler::state_dict() const {
  const auto groups = static_cast<int64_t>(base_lrs_.size());
  OrderedDict<Tensor> out;
  out.insert("last_epoch", scalar_tensor(static_cast<double>(last_epoch_), kInt64));
  out.insert("base_lrs", from_vector(base_lrs_, {groups}));
  out.insert("last_lr", from_vector(last_lr_, {static_cast<int64_t>(last_lr_.size())}));
  return out;
}

void LRScheduler::load_state_dict(const OrderedDict<Tensor>& state) {
  const Tensor& base = state["base_lrs"];
  LOOM_CHECK(base.numel() == static_cast<int64_t>(base_lrs_.size()), "LRScheduler.load_state_dict: the state has ",
             base.numel(), " base_lrs but the optimizer has ", base_lrs_.size(), " param groups");
  base_lrs_ = base.to(kFloat64).tolist<double>();
  last_epoch_ = state["last_epoch"].to(kInt64).item<int64_t>();
  apply(last_epoch_);
}

// ---- StepLR, MultiStepLR, CosineAnnealingLR, LinearLR ------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size_, double gamma_)
    : LRScheduler(optimizer), step_size(step_size_), gamma(gamma_) {
  LOOM_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  initial_step();
}

double StepLR::lr_at(size_t group, int64_t epoch) const {
  return base_lrs_[group] * std::pow(gamma, static_cast<double>(epoch / step_size));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones_, double gamma_)
    : LRScheduler(optimizer), milestones(std::move(milestones_)), gamma(gamma_) {
  std::sort(milestones.begin(), milestones.end());
  initial_step();
}

double MultiStepLR::lr_at(size_t group, int64_t epoch) const {
  auto passed = std::upper_bound(milestones.begin(), milestones.end(), epoch) - milestones.begin();
  return base_lrs_[group] * std::pow(gamma, static_cast<double>(passed));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t T_max_, double eta_min_)
    : LRScheduler(optimizer), T_max(T_max_), eta_min(eta_min_) {
  LOOM_CHECK(T_max > 0, "CosineAnnealingLR: T_max must be positive, got ", T_max);
  initial_step();
}

double CosineAnnealingLR::lr_at(size_t group, int64_t epoch) const {
  const double cosine = std::cos(std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(T_max));
  return eta_min + (base_lrs_[group] - eta_min) * (1 + cosine) / 2;
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor_, double end_factor_, int64_t total_iters_)
    : LRScheduler(optimizer), start_factor(start_factor_), end_factor(end_factor_), total_iters(total_iters_) {
  LOOM_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR: start_factor expected to be greater than 0 and at "
             "most 1, got ", start_factor);
  LOOM_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR: end_factor expected to be between 0 and 1, got ",
             end_factor);
  LOOM_CHECK(total_iters > 0, "LinearLR: total_iters must be positive, got ", total_iters);
  initial_step();
}

double LinearLR::lr_at(size_t group, int64_t epoch) const {
  const double t = static_cast<double>(std::min(epoch, total_iters)) / static_cast<double>(total_iters);
  return base_lrs_[group] * (start_factor + (end_factor - start_factor) * t);
}

// ---- LambdaLR ------------------------------------------------------------------------------

LambdaLR::LambdaLR(Optimizer& optimizer, Lambda lr_lambda)
    : LambdaLR(optimizer, std::vector<Lambda>(optimizer.param_groups().size(), lr_lambda)) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas_)
    : LRScheduler(optimizer), lr_lambdas(std::move(lr_lambdas_)) {
  LOOM_CHECK(lr_lambdas.size() == optimizer.param_groups().size(), "LambdaLR: expected ",
             optimizer.param_groups().size(), " lr_lambdas (one per param group), got ", lr_lambdas.size());
  for (size_t g = 0; g < lr_lambdas.size(); ++g)
    LOOM_CHECK(static_cast<bool>(lr_lambdas[g]), "LambdaLR: lr_lambda for param group ", g, " is empty");
  initial_step();
}

double LambdaLR::lr_at(size_t group, int64_t epoch) const { return base_lrs_[group] * lr_lambdas[group](epoch); }

double interp(double x, const std::vector<double>& xs, const std::vector<double>& ys) {
  LOOM_CHECK(!xs.empty() && xs.size() == ys.size(), "interp: expected as many ys as xs (at least one), got ",
             xs.size(), " xs and ", ys.size(), " ys");
  for (size_t i = 1; i < xs.size(); ++i)
    LOOM_CHECK(xs[i] > xs[i - 1], "interp: xs must increase strictly, but xs[", i, "] = ", xs[i], " follows ",
               xs[i - 1]);
  if (x <= xs.front()) return ys.front();
  if (x >= xs.back()) return ys.back();
  const size_t i = static_cast<size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());  // xs[i-1] <= x < xs[i]
  const double t = (x - xs[i - 1]) / (xs[i] - xs[i - 1]);
  return ys[i - 1] + t * (ys[i] - ys[i - 1]);
}

// ---- SequentialLR ---------------------------------------------------------------------------

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers_,
                           std::vector<int64_t> milestones_)
    : LRScheduler(optimizer), schedulers(std::move(schedulers_)), milestones(std::move(milestones_)) {
  LOOM_CHECK(!schedulers.empty(), "SequentialLR: expects at least one scheduler");
  LOOM_CHECK(milestones.size() + 1 == schedulers.size(), "SequentialLR: expected ", schedulers.size() - 1,
             " milestones for ", schedulers.size(), " schedulers, got ", milestones.size());
  LOOM_CHECK(std::is_sorted(milestones.begin(), milestones.end()), "SequentialLR: milestones must be increasing");
  for (size_t i = 0; i < schedulers.size(); ++i)
    LOOM_CHECK(schedulers[i] && &schedulers[i]->optimizer() == &optimizer_, "SequentialLR: scheduler ", i,
               " is null or belongs to a different optimizer");
  initial_step();
}

double SequentialLR::lr_at(size_t group, int64_t epoch) const {
  // Scheduler idx runs from milestones[idx - 1], restarted at its own epoch 0 (PyTorch
  // calls its step(0) at the milestone).
  const auto idx = static_cast<size_t>(std::upper_bound(milestones.begin(), milestones.end(), epoch) - milestones.begin());
  const int64_t local = idx == 0 ? epoch : epoch - milestones[idx - 1];
  return schedulers[idx]->lr_at(group, local);
}

// ---- OneCycleLR -----------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps_, OneCycleOptions options_)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr), total_steps_,
                 std::move(options_)) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs_, int64_t total_steps_,
                       OneCycleOptions options_)
    : LRScheduler(optimizer), total_steps(total_steps_), options(std::move(options_)), max_lrs(std::move(max_lrs_)) {
  const OneCycleOptions& o = options;
  LOOM_CHECK(total_steps > 0, "OneCycleLR: expected a positive total_steps, got ", total_steps);
  LOOM_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "OneCycleLR: expected pct_start between 0 and 1, got ", o.pct_start);
  LOOM_CHECK(o.anneal_strategy == "cos" || o.anneal_strategy == "linear",
             "OneCycleLR: anneal_strategy must be \"cos\" or \"linear\", got \"", o.anneal_strategy, "\"");
  auto& groups = optimizer_.param_groups();
  LOOM_CHECK(max_lrs.size() == groups.size(), "OneCycleLR: expected ", groups.size(), " max_lr values (one per param "
             "group), got ", max_lrs.size());
  LOOM_CHECK(!o.cycle_momentum || groups[0].has("momentum"), "OneCycleLR: optimizer ", optimizer_.name(),
             " has no momentum to cycle; pass cycle_momentum=false");

  const double steps = static_cast<double>(total_steps);
  if (o.three_phase) {
    phases_ = {{o.pct_start * steps - 1, Point::Initial, Point::Max, o.max_momentum, o.base_momentum},
               {2 * o.pct_start * steps - 2, Point::Max, Point::Initial, o.base_momentum, o.max_momentum},
               {steps - 1, Point::Initial, Point::Min, o.max_momentum, o.max_momentum}};
  } else {
    phases_ = {{o.pct_start * steps - 1, Point::Initial, Point::Max, o.max_momentum, o.base_momentum},
               {steps - 1, Point::Max, Point::Min, o.base_momentum, o.max_momentum}};
  }
  // PyTorch overwrites initial_lr with max_lr / div_factor: this schedule's start.
  for (size_t g = 0; g < groups.size(); ++g) {
    initial_lrs_.push_back(max_lrs[g] / o.div_factor);
    min_lrs_.push_back(initial_lrs_[g] / o.final_div_factor);
    groups[g].options["initial_lr"] = initial_lrs_[g];
    base_lrs_[g] = initial_lrs_[g];
  }
  initial_step();
}

double OneCycleLR::point(size_t group, Point p) const {
  switch (p) {
    case Point::Initial: return initial_lrs_[group];
    case Point::Max: return max_lrs[group];
    case Point::Min: return min_lrs_[group];
  }
  return 0;
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options.anneal_strategy == "linear") return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::locate(int64_t epoch) const {
  LOOM_CHECK(epoch <= total_steps, "OneCycleLR: tried to step ", epoch, " times; the specified number of total steps "
             "is ", total_steps, " (step once per batch: total_steps = epochs * steps_per_epoch)");
  const auto step = static_cast<double>(epoch);
  double start_step = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& phase = phases_[i];
    if (step <= phase.end_step || i + 1 == phases_.size())
      return {&phase, (step - start_step) / (phase.end_step - start_step)};
    start_step = phase.end_step;
  }
  return {nullptr, 0};  // unreachable: the last phase always matches
}

double OneCycleLR::lr_at(size_t group, int64_t epoch) const {
  auto [phase, pct] = locate(epoch);
  return anneal(point(group, phase->start), point(group, phase->end), pct);
}

double OneCycleLR::momentum_at(int64_t epoch) const {
  auto [phase, pct] = locate(epoch);
  return anneal(phase->start_momentum, phase->end_momentum, pct);
}

void OneCycleLR::apply(int64_t epoch) {
  LRScheduler::apply(epoch);
  if (!options.cycle_momentum) return;
  for (ParamGroup& group : optimizer_.param_groups()) group["momentum"] = momentum_at(epoch);
}

}  // namespace loom::optim
