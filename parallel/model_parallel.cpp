#include "parallel/model_parallel.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"
#include "core/error.h"
#include "core/factory.h"        // defines: ones_like

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

std::vector<int64_t> balance_by_time(nn::Sequential& module, const Tensor& sample, int64_t stages, int repeats) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  // Left as it was: gradients and buffers (BatchNorm's running statistics) are restored.
  std::vector<Tensor> params = module.parameters(), grads, buffers = module.buffers(), saved;
  for (const Tensor& p : params) grads.push_back(p.grad());
  {
    NoGradGuard no_grad;
    for (const Tensor& b : buffers) saved.push_back(b.clone());
  }
  std::vector<double> costs(module.size(), std::numeric_limits<double>::infinity());
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
  NoGradGuard no_grad;
  for (size_t k = 0; k < params.size(); ++k) params[k].set_grad(grads[k]);
  for (size_t k = 0; k < buffers.size(); ++k) Tensor(buffers[k]).copy_(saved[k]);
  return balance_by_cost(costs, stages);
}

std::vector<std::shared_ptr<nn::Sequential>> split_module(const nn::Sequential& module,
                                                          const std::vector<int64_t>& balance) {
  int64_t total = 0;
  for (int64_t b : balance) {
    LOOM_CHECK(b >= 1, "split_module: every stage needs at least one layer, got balance with ", b);
    total += b;
  }
  LOOM_CHECK(total == static_cast<int64_t>(module.size()), "split_module: the balance covers ", total,
             " layers, but the Sequential has ", module.size(), "; the counts must add up to its length");
  std::vector<std::shared_ptr<nn::Sequential>> stages;
  size_t next = 0;
  for (int64_t b : balance) {
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t k = 0; k < b; ++k) stage->push_back(module[next++]);
    stages.push_back(std::move(stage));
  }
  return stages;
}

ModelParallel::ModelParallel(std::shared_ptr<nn::Sequential> module, std::vector<Device> devices,
                             std::vector<int64_t> balance)
    : ModelParallel("ModelParallel", std::move(module), std::move(devices), std::move(balance)) {}

ModelParallel::ModelParallel(std::string name, std::shared_ptr<nn::Sequential> module, std::vector<Device> devices,
                             std::vector<int64_t> balance)
    : nn::Module(std::move(name)),
      module_(std::move(module)),
      devices_(std::move(devices)),
      balance_(std::move(balance)) {
  LOOM_CHECK(module_ != nullptr, type_name(), ": the module is null");
  LOOM_CHECK(!devices_.empty(), type_name(), ": no devices given");
  LOOM_CHECK(balance_.size() == devices_.size(), type_name(), ": ", balance_.size(), " stages in the balance but ",
             devices_.size(), " devices; give one device per stage");
  register_module("module", module_);
  stages_ = split_module(*module_, balance_);
  for (size_t k = 0; k < stages_.size(); ++k) stages_[k]->to(devices_[k]);
}

Tensor ModelParallel::forward(const Tensor& input) {
  Tensor x = input;
  for (size_t k = 0; k < stages_.size(); ++k) x = (*stages_[k])(x.to(devices_[k]));
  return x;
}

std::string ModelParallel::extra_repr() const {
  std::string out = "stages=[";
  for (size_t k = 0; k < stages_.size(); ++k)
    out += (k ? ", " : "") + std::to_string(balance_[k]) + " layers on " + devices_[k].str();
  return out + "]";
}

}  // namespace loom::parallel
