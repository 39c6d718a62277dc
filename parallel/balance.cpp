#include "parallel/balance.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "autograd/grad_mode.h"   // defines: NoGradGuard
#include "autograd/ops.h"
#include "core/cpu/kernel_benchmark.h"  // defines: backends::cpu::FixedKernelRules
#include "core/deterministic.h"         // defines: alert_not_deterministic (balance_by time)
#include "core/error.h"
#include "core/factory.h"         // defines: ones_like
#include "core/flop_counter.h"    // defines: FlopCounterMode (Note [Counted, not timed])

namespace loom::parallel {

// See Note [Stage balance]. best[s][i]: the smallest possible largest-group cost of the
// first i layers cut into s groups; then, from the last stage back, each stage takes as
// many layers as the optimum allows, so that earlier stages take fewer.
std::vector<int64_t> balance_by_cost(const std::vector<double>& costs, int64_t stages) {
  const auto n = static_cast<int64_t>(costs.size());
  LOOM_CHECK(stages >= 1, "balance_by_cost: expected at least one stage, got ", stages);
  LOOM_CHECK(n >= stages, "balance_by_cost: cannot cut ", n, " layers into ", stages, " non-empty stages");
  for (double c : costs) LOOM_CHECK(c >= 0, "balance_by_cost: costs must be >= 0, got ", c);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + costs[size_t(i)];
  auto group = [&](int64_t from, int64_t to) { return prefix[size_t(to)] - prefix[size_t(from)]; };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages) + 1, std::vector<double>(size_t(n) + 1, kInf));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s)
    for (int64_t i = s; i <= n; ++i)
      for (int64_t j = s - 1; j < i; ++j)
        best[size_t(s)][size_t(i)] = std::min(best[size_t(s)][size_t(i)], std::max(best[size_t(s) - 1][size_t(j)], group(j, i)));
  const double target = best[size_t(stages)][size_t(n)];
  std::vector<int64_t> balance(static_cast<size_t>(stages));
  int64_t end = n;
  for (int64_t s = stages; s >= 1; --s) {
    int64_t start = s - 1;  // the most layers this stage can take while the rest stays optimal
    while (group(start, end) > target || best[size_t(s) - 1][size_t(start)] > target) ++start;
    balance[size_t(s) - 1] = end - start;
    end = start;
  }
  return balance;
}

namespace {

// Running a module to cost it must not change it: its gradients and buffers (BatchNorm's
// running statistics) are put back as they were when this goes out of scope.
class ModuleStateGuard {
 public:
  explicit ModuleStateGuard(nn::Module& module) : params_(module.parameters()), buffers_(module.buffers()) {
    NoGradGuard no_grad;
    for (const Tensor& p : params_) grads_.push_back(p.grad());
    for (const Tensor& b : buffers_) saved_.push_back(b.clone());
  }
  ~ModuleStateGuard() {
    NoGradGuard no_grad;
    for (size_t k = 0; k < params_.size(); ++k) params_[k].set_grad(grads_[k]);
    for (size_t k = 0; k < buffers_.size(); ++k) Tensor(buffers_[k]).copy_(saved_[k]);
  }
  ModuleStateGuard(const ModuleStateGuard&) = delete;
  ModuleStateGuard& operator=(const ModuleStateGuard&) = delete;

 private:
  std::vector<Tensor> params_, grads_, buffers_, saved_;
};

// The weights of Note [Balance by a cost model], in forward FLOPs per byte: fitted (least
// squares, relative) to the measured forward + backward time of ResNet18's 14 layers at
// micro-batches of 8 and 32 on one thread of a 2-core AMD EPYC with AVX-512 (oneDNN 2.6
// float32), rounded: 21 and 207 came out, and the fit is within 10% for 14 of the 16
// residual blocks' timings. A byte of parameters costs ten times a byte of activations
// because every micro-batch streams each weight several times at low arithmetic
// intensity: reordered into the kernel's layout in forward and in backward, its gradient
// computed and accumulated.
constexpr double kFlopsPerActivationByte = 20.0;
constexpr double kFlopsPerParameterByte = 200.0;

}  // namespace

double LayerCost::cost() const {
  return static_cast<double>(flops) + kFlopsPerActivationByte * static_cast<double>(activation_bytes) +
         kFlopsPerParameterByte * static_cast<double>(parameter_bytes);
}

// Note [Activation bytes by difference]: each layer runs on one example and on two; the
// bytes the second run allocates beyond the first are one example's activations. What
// does not grow with the batch (a convolution's weights reordered into the layout its
// kernel wants, which depends on the CPU and the library) cancels out, and the counts
// stay the same on every machine.
std::vector<LayerCost> count_layer_costs(nn::Sequential& module, const Tensor& sample) {
  LOOM_CHECK(sample.dim() >= 1 && sample.size(0) >= 1, "count_layer_costs: expected a sample batch of at least one "
             "example (its first dimension the batch), got shape ", sample.shape());
  const int64_t batch = sample.size(0);
  ModuleStateGuard keep(module);
  NoGradGuard no_grad;  // the counts are the forward's; backward's are the formula's
  // Every rank must count alike: Note [Fixed rules where every rank must count alike].
  backends::cpu::FixedKernelRules fixed;
  Tensor one = sample.narrow(0, 0, 1);
  Tensor two = cat({one, one}, 0);
  std::vector<LayerCost> costs;
  for (size_t i = 0; i < module.size(); ++i) {
    LayerCost c;
    int64_t bytes_one = 0, bytes_two = 0;
    {
      FlopCounterMode counter;
      one = (*module[i])(one);
      c.flops = counter.total_flops() * batch;  // exactly linear in the batch
      bytes_one = counter.allocated_bytes();
    }
    {
      FlopCounterMode counter;
      two = (*module[i])(two);
      bytes_two = counter.allocated_bytes();
    }
    c.activation_bytes = std::max<int64_t>(bytes_two - bytes_one, 0) * batch;  // Note [Activation bytes by difference]
    for (const Tensor& p : module[i]->parameters()) c.parameter_bytes += static_cast<int64_t>(p.nbytes());
    costs.push_back(c);
  }
  return costs;
}

std::vector<int64_t> balance_by_cost_model(nn::Sequential& module, const Tensor& sample, int64_t stages) {
  std::vector<double> costs;
  for (const LayerCost& c : count_layer_costs(module, sample)) costs.push_back(c.cost());
  return balance_by_cost(costs, stages);
}

std::vector<int64_t> balance_by_time(nn::Sequential& module, const Tensor& sample, int64_t stages, int repeats) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  std::vector<double> costs(module.size(), std::numeric_limits<double>::infinity());
  {
    ModuleStateGuard keep(module);
    for (int r = 0; r <= std::max(1, repeats); ++r) {  // run 0 warms up (oneDNN builds its kernels)
      Tensor x = sample;
      for (size_t i = 0; i < module.size(); ++i) {
        Tensor in = x.detach();
        if (is_floating(in.dtype())) in.requires_grad_(true);
        auto t0 = Clock::now();
        Tensor out = (*module[i])(in);
        auto t1 = Clock::now();
        if (out.requires_grad()) out.backward(ones_like(out));
        if (r > 0) costs[i] = std::min(costs[i], seconds(t0, t1) + seconds(t1, Clock::now()));
        x = out.detach();
      }
    }
  }
  return balance_by_cost(costs, stages);
}

void check_balance(const std::vector<int64_t>& balance, int64_t stages, int64_t layers) {
  int64_t total = 0;
  bool positive = true;
  for (int64_t b : balance) {
    total += b;
    positive = positive && b >= 1;
  }
  const std::string given = detail::str("got ", balance.size(), " entries adding up to ", total);
  LOOM_CHECK(static_cast<int64_t>(balance.size()) == stages && total == layers && positive, "balance: expected ",
             stages, " positive layer counts (one per virtual stage: stages × virtual stages per stage) adding up to "
             "the Sequential's length, ", layers, " layers; ", given);
}

void check_balance_by(const std::string& by) {
  LOOM_CHECK(by == "cost" || by == "time", "balance_by: expected \"cost\" (the cost model) or \"time\" (measured), "
             "got '", by, "'");
  // Note [Same command, same model] (core/deterministic.h): measured times, and so the cut, differ run to run.
  if (by == "time")
    alert_not_deterministic("balance_by \"time\" (a pipeline cut by measured layer times)",
                            "cut by \"cost\" (counted FLOPs and bytes, the same every run) or give the layer counts");
}

std::vector<int64_t> choose_balance(nn::Sequential& module, const std::vector<int64_t>& given, const std::string& by,
                                    int64_t stages, const Tensor& sample) {
  const auto layers = static_cast<int64_t>(module.size());
  if (!given.empty()) {
    check_balance(given, stages, layers);
    return given;
  }
  check_balance_by(by);
  LOOM_CHECK(stages >= 1 && stages <= layers, "cannot cut the model's ", layers, " layers into ", stages,
             " stages (stages × virtual stages): every stage needs at least one layer");
  return by == "cost" ? balance_by_cost_model(module, sample, stages) : balance_by_time(module, sample, stages);
}

std::string balance_str(const std::vector<int64_t>& balance) {
  std::string out;
  for (size_t i = 0; i < balance.size(); ++i) out += (i ? "," : "") + std::to_string(balance[i]);
  return out;
}

}  // namespace loom::parallel
