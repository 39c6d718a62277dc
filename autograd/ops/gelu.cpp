// gelu (torch.nn.functional.gelu, approximate "none" or "tanh") and its gradient.
#include <string>

#include "autograd/ops.h"                  // declares: gelu
#include "autograd/ops/common.h"           // defines: check_defined, check_floating
#include "core/kernels.h"                  // declares: gelu_forward_kernel, gelu_backward_kernel

namespace loom {

Tensor gelu(const Tensor& input, const std::string& approximate) {
  LOOM_CHECK(approximate == "none" || approximate == "tanh", "gelu: expected approximate to be \"none\" or "
             "\"tanh\", got \"", approximate, "\"");
  ops::check_defined("gelu", input, "input");
  ops::check_floating("gelu", input);
  const bool tanh_approximation = approximate == "tanh";
  Tensor out = empty_like(input);
  gelu_forward_kernel(input.device())(input.detach(), tanh_approximation, out);
  if (any_requires_grad({input})) {
    // The derivative needs x, which the output cannot give back: the input is saved.
    record("GeluBackward", {input}, {out},
           [x_ = SavedTensor(input, "GeluBackward"), tanh_approximation](const std::vector<Tensor>& g) {
             const Tensor& x = x_.get();
             ops::check_same_device_dtype("gelu backward", g[0], x);
             Tensor grad_x = empty_like(g[0]);
             gelu_backward_kernel(x.device())(g[0], x, tanh_approximation, grad_x);
             return std::vector<Tensor>{grad_x};
           });
  }
  return out;
}

}  // namespace loom
