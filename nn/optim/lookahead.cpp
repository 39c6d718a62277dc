#include "nn/optim/lookahead.h"

#include "autograd/grad_mode.h"
#include "autograd/ops.h"  // defines: clone, sub, mul, add (lerp_ off the CPU)

namespace loom::optim {

namespace {

template <typename T>
void lerp_loop(T* start, const T* end, int64_t n, T weight) {
  // See Note [Lookahead averages buffers]: PyTorch's two-sided lerp formula.
  const bool low = weight < T(0.5);
  const T rest = T(1) - weight;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T diff = end[i] - start[i];
    start[i] = low ? start[i] + weight * diff : end[i] - diff * rest;
  }
}

}  // namespace

void lerp_(Tensor& start, const Tensor& end, double weight) {
  LOOM_CHECK(start.shape() == end.shape() && start.dtype() == end.dtype() && start.device() == end.device(),
             "lerp_: start and end must have the same shape, dtype and device, got ", start.str(), " and ", end.str());
  LOOM_CHECK(is_floating(start.dtype()), "lerp_: expected floating-point tensors, got ", start.str());
  NoGradGuard no_grad;
  if (start.device().is_cpu() && start.is_contiguous() && end.is_contiguous() &&
      (start.dtype() == kFloat32 || start.dtype() == kFloat64)) {
    dispatch_floating(start.dtype(), "lerp_", [&]<typename T>() {
      lerp_loop<T>(start.data_ptr<T>(), end.data_ptr<T>(), start.numel(), static_cast<T>(weight));
    });
  } else {  // other devices and dtypes: the same formula from tensor ops
    const Tensor diff = sub(end, start);
    start.copy_(weight < 0.5 ? add(start, diff * weight) : sub(end, diff * (1.0 - weight)));
  }
  start.bump_version();
}

Lookahead::Lookahead(nn::Module& model) : model_(model) {
  NoGradGuard no_grad;
  for (const auto& [name, tensor] : model_.state_dict()) {
    if (!is_floating(tensor.dtype())) continue;  // See Note [Lookahead averages buffers]
    names_.push_back(name);
    average_.push_back(clone(tensor.detach()));
  }
}

void Lookahead::update(double decay) {
  LOOM_CHECK(decay >= 0 && decay <= 1, "Lookahead.update: decay must be in [0, 1], got ", decay);
  NoGradGuard no_grad;
  const OrderedDict<Tensor> state = model_.state_dict();
  for (size_t i = 0; i < names_.size(); ++i) {
    const Tensor* live = state.find(names_[i]);
    LOOM_CHECK(live && live->shape() == average_[i].shape(), "Lookahead.update: the model's state_dict entry '",
               names_[i], "' ", live ? "changed shape to " + detail::str(live->shape()) : std::string("is gone"),
               " since the Lookahead was made (shape ", average_[i].shape(), "); make the Lookahead after the model "
               "is built and moved");
    Tensor model_tensor = live->detach();  // same storage: writing it writes the model
    if (model_tensor.dtype() != average_[i].dtype() || model_tensor.device() != average_[i].device())
      average_[i] = average_[i].to(model_tensor.device()).to(model_tensor.dtype());  // the model moved
    lerp_(average_[i], model_tensor.contiguous(), 1.0 - decay);
    model_tensor.copy_(average_[i]);
    live->bump_version();
  }
}

OrderedDict<Tensor> Lookahead::state_dict() const {
  OrderedDict<Tensor> out;
  for (size_t i = 0; i < names_.size(); ++i) out.insert(names_[i], average_[i]);
  return out;
}

void Lookahead::load_state_dict(const OrderedDict<Tensor>& state) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < names_.size(); ++i) {
    const Tensor* saved = state.find(names_[i]);
    LOOM_CHECK(saved, "Lookahead.load_state_dict: the state has no entry '", names_[i], "' (", state.size(),
               " entries)");
    LOOM_CHECK(saved->shape() == average_[i].shape(), "Lookahead.load_state_dict: '", names_[i], "' has shape ",
               saved->shape(), " but the model's is ", average_[i].shape());
    average_[i].copy_(*saved);
  }
}

}  // namespace loom::optim
