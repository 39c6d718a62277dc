// SGD: stochastic gradient descent with momentum, dampening, Nesterov and weight decay,
// with PyTorch's exact update rule (torch.optim.SGD).
//
//   optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4,
//                                        .nesterov = true});
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Note [SGD update rule]
// For each parameter p with gradient g (PyTorch's torch/optim/sgd.py, step by step):
//   d_p = g                                  (-g when maximize)
//   d_p = d_p + weight_decay * p             if weight_decay != 0
//   if momentum != 0:
//     buf = d_p                              on p's first step (no dampening then)
//     buf = momentum * buf + (1 - dampening) * d_p   afterwards
//     d_p = d_p + momentum * buf             if nesterov
//     d_p = buf                              otherwise
//   p = p - lr * d_p
// Note the first momentum step stores d_p *after* weight decay, undampened.
// The whole rule runs as one fused loop per parameter (sgd_update_kernel) instead of a
// chain of tensor ops: one read of p, g and buf and one write of p and buf per element,
// rather than an intermediate tensor per line above.
#pragma once

#include "core/dispatch.h"
#include "nn/optim/optimizer.h"

namespace loom::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

class SGD : public Optimizer {
 public:
  SGD(const std::vector<Tensor>& params, SGDOptions options);
  // PyTorch's positional spelling: SGD(params, lr, momentum, dampening, weight_decay, nesterov).
  SGD(const std::vector<Tensor>& params, double lr, double momentum = 0.0, double dampening = 0.0,
      double weight_decay = 0.0, bool nesterov = false);
  // Groups with their own options ("lr", "momentum", "dampening", "weight_decay",
  // "nesterov", "maximize"); missing ones come from `defaults`.
  SGD(std::vector<ParamGroup> groups, SGDOptions defaults);

  void step() override;
};

// The hyperparameters of one parameter's update; see Note [SGD update rule].
struct SGDStep {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
  bool first_step;  // momentum_buffer holds garbage and is to be initialised with d_p
};

// param, grad and momentum_buffer: same shape, dtype and device, contiguous;
// momentum_buffer is undefined when momentum == 0. Updates param (and buffer) in place.
// The CPU kernel (float32/float64, OpenMP) is in sgd.cpp; a CUDA backend registers its
// own with LOOM_REGISTER_KERNEL(sgd_update_kernel, DeviceType::CUDA, ...).
LOOM_DECLARE_KERNEL(sgd_update_kernel,
                    void (*)(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SGDStep& step));

}  // namespace loom::optim
