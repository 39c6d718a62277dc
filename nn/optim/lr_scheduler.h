// Learning-rate schedulers, as torch.optim.lr_scheduler: each owns a closed-form lr(epoch)
// and writes it into the optimizer's param groups on step().
//
//   optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
//   optim::CosineAnnealingLR sched(opt, /*T_max=*/epochs);
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     train_one_epoch(...);          // opt.step() inside
//     sched.step();                  // after the optimizer's steps, as in PyTorch
//   }
//
// Construction performs PyTorch's initial step: last_epoch becomes 0 and every group's
// lr is set to lr_at(0) (so LinearLR's warm-up starts at start_factor * lr at once). The
// "initial_lr" of each group is recorded in the group on first use (as PyTorch's
// setdefault), and is each scheduler's base_lr; so a second scheduler on the same
// optimizer (SequentialLR's children) starts from the original lr, not a scheduled one.
//
// Note [Closed-form schedules]
// PyTorch's schedulers update lr recursively (lr_t from lr_{t-1}) so that several can
// compose multiplicatively; loom's compute lr_t directly from base_lr and t, which is the
// same value (PyTorch's own _get_closed_form_lr) whenever nothing else edits lr, and makes
// each schedule a pure function that tests can check against its formula and that
// resumes exactly from last_epoch alone. SequentialLR switches between closed forms; a
// multiplicative ChainedScheduler is not provided.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/optim/optimizer.h"

namespace loom::optim {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one epoch (or one iteration, for per-step schedules such as OneCycleLR).
  void step();
  // The learning rate of group `group` at `epoch` (pure; does not touch the optimizer).
  virtual double lr_at(size_t group, int64_t epoch) const = 0;
  std::vector<double> get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }

  // {"last_epoch": int64 [], "base_lrs": float64 [groups], "last_lr": float64 [groups]}.
  // Loading re-applies last_lr to the optimizer, so training resumes on the same schedule.
  OrderedDict<Tensor> state_dict() const;
  void load_state_dict(const OrderedDict<Tensor>& state);

 protected:
  // Derived constructors call this last (lr_at is not virtual-dispatchable before then).
  void initial_step() { step(); }
  // Sets every group's lr to lr_at(group, last_epoch) and whatever else a schedule drives.
  virtual void apply(int64_t epoch);

  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
};

// base_lr * gamma^(epoch / step_size): decay by gamma every step_size epochs.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(size_t group, int64_t epoch) const override;
  int64_t step_size;
  double gamma;
};

// base_lr * gamma^(number of milestones <= epoch); a repeated milestone counts twice.
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr_at(size_t group, int64_t epoch) const override;
  std::vector<int64_t> milestones;  // sorted
  double gamma;
};

// eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (SGDR without restarts;
// past T_max the cosine continues, as PyTorch's).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t T_max, double eta_min = 0.0);
  double lr_at(size_t group, int64_t epoch) const override;
  int64_t T_max;
  double eta_min;
};

// base_lr * (start_factor + (end_factor - start_factor) * min(epoch, total_iters) / total_iters):
// the usual warm-up from a fraction of the lr to the full lr.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(size_t group, int64_t epoch) const override;
  double start_factor, end_factor;
  int64_t total_iters;
};

// base_lr * lr_lambda(epoch): any schedule as a function of the step (or epoch) count, one
// function for every group or one per group, as torch.optim.lr_scheduler.LambdaLR. The
// function must be pure (lr_at may call it for any epoch, and resuming calls it once).
//   optim::LambdaLR sched(opt, [](int64_t step) { return std::min(1.0, (step + 1) / 100.0); });
class LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  LambdaLR(Optimizer& optimizer, Lambda lr_lambda);
  LambdaLR(Optimizer& optimizer, std::vector<Lambda> lr_lambdas);
  double lr_at(size_t group, int64_t epoch) const override;
  std::vector<Lambda> lr_lambdas;
};

// The piecewise-linear factor through (xs[i], ys[i]) at x, flat beyond the ends (numpy.interp);
// xs strictly increasing. With LambdaLR it draws a triangular schedule:
//   LambdaLR(opt, [=](int64_t s) { return interp(s, {0, 0.23 * T, T}, {0.2, 1.0, 0.07}); }).
double interp(double x, const std::vector<double>& xs, const std::vector<double>& ys);

// Runs schedulers[0] until milestones[0], then schedulers[1] restarted at its epoch 0, ...
// The children must have been built on the same optimizer and must not be stepped
// themselves (SequentialLR evaluates their closed forms).
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(size_t group, int64_t epoch) const override;
  std::vector<std::shared_ptr<LRScheduler>> schedulers;
  std::vector<int64_t> milestones;
};

// The 1cycle policy (Smith & Topin 2018), stepped once per *batch*: lr rises from
// max_lr / div_factor to max_lr over the first pct_start of total_steps, then anneals to
// max_lr / div_factor / final_div_factor; momentum moves opposite, between max_momentum
// and base_momentum, when cycle_momentum. three_phase adds a symmetric descent back to
// the initial lr before the final annealing. All defaults are PyTorch's.
struct OneCycleOptions {
  double pct_start = 0.3;
  std::string anneal_strategy = "cos";  // or "linear"
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps, OneCycleOptions options = {});
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps, OneCycleOptions options = {});
  double lr_at(size_t group, int64_t epoch) const override;
  double momentum_at(int64_t epoch) const;

  int64_t total_steps;
  OneCycleOptions options;
  std::vector<double> max_lrs;

 protected:
  void apply(int64_t epoch) override;

 private:
  enum class Point { Initial, Max, Min };  // initial_lr = max_lr / div_factor, min_lr = initial_lr / final_div_factor
  struct Phase {
    double end_step;
    Point start, end;
    double start_momentum, end_momentum;
  };
  double point(size_t group, Point p) const;
  double anneal(double start, double end, double pct) const;
  // The phase holding `epoch` and how far through it (0..1) epoch is.
  std::pair<const Phase*, double> locate(int64_t epoch) const;

  std::vector<Phase> phases_;
  std::vector<double> initial_lrs_, min_lrs_;
};

// The linear scaling rule (Goyal et al. 2017): with world_size replicas each seeing the
// single-device batch, the global batch grows world_size times, and so does the lr.
// Pair it with a warm-up (LinearLR) for large world sizes.
inline double scale_lr_linear(double base_lr, int64_t world_size) {
  LOOM_CHECK(world_size > 0, "scale_lr_linear: world_size must be positive, got ", world_size);
  return base_lr * static_cast<double>(world_size);
}

}  // namespace loom::optim
