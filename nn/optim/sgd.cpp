#include "nn/optim/sgd.h"

#include "autograd/grad_mode.h"
#include "core/factory.h"

namespace loom::optim {

LOOM_DEFINE_KERNEL(sgd_update_kernel);

namespace {

std::map<std::string, double> to_defaults(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

void check_group(const ParamGroup& g, size_t index) {
  LOOM_CHECK(g["lr"] >= 0, "SGD: invalid learning rate ", g["lr"], " in param group ", index);
  LOOM_CHECK(g["momentum"] >= 0, "SGD: invalid momentum value ", g["momentum"], " in param group ", index);
  LOOM_CHECK(g["weight_decay"] >= 0, "SGD: invalid weight_decay value ", g["weight_decay"], " in param group ", index);
  LOOM_CHECK(g["nesterov"] == 0 || (g["momentum"] > 0 && g["dampening"] == 0), "SGD: Nesterov momentum requires a "
             "momentum and zero dampening (param group ", index, " has momentum ", g["momentum"], ", dampening ",
             g["dampening"], ")");
}

// See Note [SGD update rule]. The branches test loop invariants, which the compiler
// hoists out of the loop.
template <typename T>
void sgd_update_loop(T* p, const T* g, T* buf, int64_t n, const SGDStep& s) {
  const T lr = static_cast<T>(s.lr), wd = static_cast<T>(s.weight_decay), mom = static_cast<T>(s.momentum);
  const T keep = static_cast<T>(1.0 - s.dampening);
  const bool decay = s.weight_decay != 0, momentum = s.momentum != 0;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    T d = s.maximize ? -g[i] : g[i];
    if (decay) d += wd * p[i];
    if (momentum) {
      const T b = s.first_step ? d : mom * buf[i] + keep * d;
      buf[i] = b;
      d = s.nesterov ? d + mom * b : b;
    }
    p[i] -= lr * d;
  }
}

void sgd_update_cpu(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SGDStep& step) {
  dispatch_floating(param.dtype(), "SGD step", [&]<typename T>() {
    sgd_update_loop<T>(param.data_ptr<T>(), grad.data_ptr<T>(),
                       momentum_buffer.defined() ? momentum_buffer.data_ptr<T>() : nullptr, param.numel(), step);
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(sgd_update_kernel, DeviceType::CPU, sgd_update_cpu);

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options) : SGD(std::vector<ParamGroup>{{params, {}}}, options) {}

SGD::SGD(const std::vector<Tensor>& params, double lr, double momentum, double dampening, double weight_decay,
         bool nesterov)
    : SGD(params, SGDOptions{lr, momentum, dampening, weight_decay, nesterov, false}) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults) : Optimizer(std::move(groups), to_defaults(defaults), "SGD") {
  for (size_t i = 0; i < param_groups().size(); ++i) check_group(param_groups()[i], i);
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t gi = 0; gi < param_groups().size(); ++gi) {
    const ParamGroup& group = param_groups()[gi];
    check_group(group, gi);  // schedulers and users may have edited the group
    SGDStep s{group["lr"], group["momentum"], group["dampening"], group["weight_decay"],
              group["nesterov"] != 0, group["maximize"] != 0, false};
    for (size_t pi = 0; pi < group.params.size(); ++pi) {
      const Tensor& p = group.params[pi];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;  // frozen, or unused in this forward
      LOOM_CHECK(grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(),
                 "SGD: parameter ", pi, " of group ", gi, " is ", p.str(), " but its gradient is ", grad.str());
      LOOM_CHECK(p.is_contiguous(), "SGD: parameter ", pi, " of group ", gi, " is not contiguous (shape ", p.shape(),
                 ", strides ", p.strides(), "); the fused update needs contiguous parameters");
      Tensor buf;
      s.first_step = false;
      if (s.momentum != 0) {
        Tensor* existing = state_[p.unsafe_impl()].find("momentum_buffer");
        if (existing && existing->defined()) {
          // Follow the parameter if the model moved after this buffer was made.
          if (existing->device() != p.device() || existing->dtype() != p.dtype())
            *existing = existing->to(p.device()).to(p.dtype());
          buf = *existing;
        } else {
          buf = empty_like(p);
          state_[p.unsafe_impl()].insert("momentum_buffer", buf);
          s.first_step = true;
        }
      }
      Tensor data = p.detach();  // same storage; the kernel writes through it
      sgd_update_kernel(p.device())(data, grad.contiguous(), buf, s);
      p.bump_version();
      if (buf.defined()) buf.bump_version();
    }
  }
}

}  // namespace loom::optim
