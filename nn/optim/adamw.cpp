#include "nn/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "core/dtype.h"          // defines: dispatch_floating
#include "core/factory.h"        // defines: zeros, zeros_like
#include "core/kernels.h"        // declares: adamw_update_kernel, AdamWStep
#include "nn/embedding.h"        // defines: Embedding (no weight decay on its table)

namespace loom {
// The stub lives beside its CPU kernel (core/kernels.h, "optimizers").
LOOM_DEFINE_KERNEL(adamw_update_kernel);
}  // namespace loom

namespace loom::optim {
namespace {

std::map<std::string, double> to_defaults(const AdamWOptions& o) {
  return {{"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

void check_group(const ParamGroup& g, size_t index) {
  LOOM_CHECK(g["lr"] >= 0, "AdamW: invalid learning rate ", g["lr"], " in param group ", index);
  LOOM_CHECK(g["eps"] >= 0, "AdamW: invalid epsilon value ", g["eps"], " in param group ", index);
  LOOM_CHECK(g["beta1"] >= 0 && g["beta1"] < 1, "AdamW: invalid beta parameter at index 0: ", g["beta1"],
             " in param group ", index, " (expected 0 <= beta1 < 1)");
  LOOM_CHECK(g["beta2"] >= 0 && g["beta2"] < 1, "AdamW: invalid beta parameter at index 1: ", g["beta2"],
             " in param group ", index, " (expected 0 <= beta2 < 1)");
  LOOM_CHECK(g["weight_decay"] >= 0, "AdamW: invalid weight_decay value ", g["weight_decay"], " in param group ",
             index);
}

// One parameter's update: Note [AdamW update rule]. The CPU slot of adamw_update_kernel
// (cuda/adamw.cu has the CUDA one).
template <typename T>
void adamw_update_loop(T* p, const T* g, T* m, T* v, T* v_max, int64_t n, const AdamWStep& s) {
  const T decay = static_cast<T>(s.decay_factor), b1 = static_cast<T>(s.beta1), b2 = static_cast<T>(s.beta2);
  const T one_minus_b1 = static_cast<T>(1 - s.beta1), one_minus_b2 = static_cast<T>(1 - s.beta2);
  const T step_size = static_cast<T>(s.step_size), bc2_sqrt = static_cast<T>(s.bias_correction2_sqrt);
  const T eps = static_cast<T>(s.eps);
  const bool maximize = s.maximize;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const T grad = maximize ? -g[i] : g[i];
    const T decayed = p[i] * decay;
    const T mi = b1 * m[i] + one_minus_b1 * grad;
    const T vi = b2 * v[i] + one_minus_b2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    T second = vi;
    if (v_max) {
      second = std::max(v_max[i], vi);
      v_max[i] = second;
    }
    const T denom = std::sqrt(second) / bc2_sqrt + eps;
    p[i] = decayed - step_size * (mi / denom);
  }
}

void adamw_update_cpu(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                      Tensor& max_exp_avg_sq, const AdamWStep& s) {
  dispatch_floating(param.dtype(), "AdamW step", [&]<typename T>() {
    adamw_update_loop<T>(param.data_ptr<T>(), grad.data_ptr<T>(), exp_avg.data_ptr<T>(), exp_avg_sq.data_ptr<T>(),
                         max_exp_avg_sq.defined() ? max_exp_avg_sq.data_ptr<T>() : nullptr, param.numel(), s);
  });
}

// The named state tensor of p, created as zeros of p's shape on first use; it follows p
// if the model moved since. A handle, not a reference: the next insert may move the dict's items.
Tensor moment(OrderedDict<Tensor>& state, const Tensor& p, const char* name) {
  Tensor* existing = state.find(name);
  if (!existing || !existing->defined()) return state.insert(name, zeros_like(p));
  if (existing->device() != p.device() || existing->dtype() != p.dtype())
    *existing = existing->to(p.device()).to(p.dtype());
  return *existing;
}

}  // namespace

LOOM_REGISTER_KERNEL(adamw_update_kernel, DeviceType::CPU, adamw_update_cpu);

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{{params, {}}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults)
    : Optimizer(std::move(groups), to_defaults(defaults), "AdamW") {
  for (size_t i = 0; i < param_groups().size(); ++i) check_group(param_groups()[i], i);
}

void AdamW::step() {
  NoGradGuard no_grad;
  for (size_t gi = 0; gi < param_groups().size(); ++gi) {
    const ParamGroup& group = param_groups()[gi];
    check_group(group, gi);  // schedulers and users may have edited the group
    const double lr = group["lr"], beta1 = group["beta1"], beta2 = group["beta2"];
    const bool amsgrad = group["amsgrad"] != 0;
    for (size_t pi = 0; pi < group.params.size(); ++pi) {
      const Tensor& p = group.params[pi];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;  // frozen, or unused in this forward
      LOOM_CHECK(grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(),
                 "AdamW: parameter ", pi, " of group ", gi, " is ", p.str(), " but its gradient is ", grad.str());
      LOOM_CHECK(p.is_contiguous(), "AdamW: parameter ", pi, " of group ", gi, " is not contiguous (shape ",
                 p.shape(), ", strides ", p.strides(), "); the fused update needs contiguous parameters");
      OrderedDict<Tensor>& state = state_[p.unsafe_impl()];
      Tensor* step_t = state.find("step");
      if (!step_t) step_t = &state.insert("step", zeros({}, kFloat32));
      const double step = step_t->to(kFloat64).item<double>() + 1;
      step_t->fill_(step);
      Tensor exp_avg = moment(state, p, "exp_avg");
      Tensor exp_avg_sq = moment(state, p, "exp_avg_sq");
      Tensor max_exp_avg_sq = amsgrad ? moment(state, p, "max_exp_avg_sq") : Tensor();
      const AdamWStep s{1 - lr * group["weight_decay"], beta1, beta2, lr / (1 - std::pow(beta1, step)),
                        std::sqrt(1 - std::pow(beta2, step)), group["eps"], group["maximize"] != 0};
      const Tensor g = grad.contiguous();
      Tensor data = p.detach();  // same storage; the kernel writes through it
      adamw_update_kernel(p.device())(data, g, exp_avg, exp_avg_sq, max_exp_avg_sq, s);
      p.bump_version();
      exp_avg.bump_version();
      exp_avg_sq.bump_version();
    }
  }
}

std::function<bool(const std::string& name, int64_t dim)> exempt_from_weight_decay(
    const nn::Module& model, const std::set<std::string>& no_weight_decay) {
  auto exempt = std::make_shared<std::set<std::string>>(no_weight_decay);
  std::function<void(const nn::Module&, const std::string&)> find_embeddings = [&](const nn::Module& m,
                                                                                  const std::string& prefix) {
    if (dynamic_cast<const nn::Embedding*>(&m)) exempt->insert(prefix + "weight");
    for (const auto& item : m.named_children()) find_embeddings(*item.second, prefix + item.first + ".");
  };
  find_embeddings(model, "");
  return [exempt](const std::string& name, int64_t dim) {
    return dim <= 1 || (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) || exempt->count(name) > 0;
  };
}

std::vector<ParamGroup> param_groups_weight_decay(const nn::Module& model, double weight_decay,
                                                  const std::set<std::string>& no_weight_decay) {
  const auto exempt = exempt_from_weight_decay(model, no_weight_decay);
  ParamGroup decay{{}, {{"weight_decay", weight_decay}}}, no_decay{{}, {{"weight_decay", 0.0}}};
  for (const auto& [name, p] : model.named_parameters()) (exempt(name, p.dim()) ? no_decay : decay).params.push_back(p);
  std::vector<ParamGroup> groups;
  for (ParamGroup* g : {&no_decay, &decay})
    if (!g->params.empty()) groups.push_back(std::move(*g));
  return groups;
}

}  // namespace loom::optim
