// CPU GELU, forward and backward, exact and tanh-approximated (torch.nn.functional.gelu).
//
//   exact:  gelu(x) = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))) = 0.5 * x * erfc(-x / sqrt(2))
//           gelu'(x) = Phi(x) + x * phi(x),        phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
//   tanh:   gelu(x) = 0.5 * x * (1 + tanh(u)),     u = sqrt(2 / pi) * (x + 0.044715 x^3)
//           gelu'(x) = 0.5 * (1 + t) + 0.5 * x * (1 - t^2) * du/dx,   t = tanh(u),
//           du/dx = sqrt(2 / pi) * (1 + 3 * 0.044715 x^2)
//
// Backward recomputes from x (the op saves its input, as PyTorch's GeluBackward does):
// the derivative needs x itself, and the output alone cannot give it back. The exact
// form is computed through erfc and exp of core/cpu/vector_math.h, which vectorise for
// float32 and stay accurate on the negative side (Note [Vectorisable exp and erf]).
#include <cmath>

#include "core/cpu/bf16_convert.h"         // defines: dispatch_floating_16bit, widen, narrow
#include "core/cpu/loops.h"                // defines: cpu_map_typed
#include "core/cpu/transformer_kernels.h"  // declares: gelu_forward, gelu_backward
#include "core/cpu/vector_math.h"          // defines: vector_exp, vector_erfc
#include "core/dtype.h"                    // defines: dispatch_floating
#include "core/kernels.h"                  // declares: gelu_forward_kernel, gelu_backward_kernel

namespace loom::cpu {
namespace {

constexpr double kSqrt1_2 = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588; // sqrt(2 / pi)
constexpr double kCubic = 0.044715;

template <typename T>
T gelu_exact(T x) {
  return T(0.5) * x * vector_erfc(-x * T(kSqrt1_2));
}

template <typename T>
T gelu_tanh(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}

template <typename T>
T gelu_exact_derivative(T x) {
  const T cdf = T(0.5) * vector_erfc(-x * T(kSqrt1_2));
  const T pdf = T(kInvSqrt2Pi) * vector_exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

template <typename T>
T gelu_tanh_derivative(T x) {
  const T x2 = x * x;
  const T t = std::tanh(T(kSqrt2OverPi) * (x + T(kCubic) * x2 * x));
  const T du = T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x2);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

}  // namespace

// bfloat16 (CPU autocast's activations) computes in float32 and rounds once per element
// (Note [bfloat16 conversion in registers]).
void gelu_forward(const Tensor& x, bool tanh_approximation, Tensor& out) {
  dispatch_floating_16bit(x.dtype(), "gelu", [&]<typename E>() {
    using T = compute_t<E>;
    if (tanh_approximation)
      cpu_map_typed<E, E>(out, [](E v) { return narrow<E>(gelu_tanh(widen(v))); }, x);
    else
      cpu_map_typed<E, E>(out, [](E v) { return narrow<E>(gelu_exact(static_cast<T>(widen(v)))); }, x);
  });
}

void gelu_backward(const Tensor& grad_out, const Tensor& x, bool tanh_approximation, Tensor& grad_x) {
  dispatch_floating_16bit(x.dtype(), "gelu_backward", [&]<typename E>() {
    if (tanh_approximation)
      cpu_map_typed<E, E, E>(grad_x, [](E g, E v) { return narrow<E>(widen(g) * gelu_tanh_derivative(widen(v))); },
                             grad_out, x);
    else
      cpu_map_typed<E, E, E>(grad_x, [](E g, E v) { return narrow<E>(widen(g) * gelu_exact_derivative(widen(v))); },
                             grad_out, x);
  });
}

LOOM_REGISTER_KERNEL(gelu_forward_kernel, DeviceType::CPU, gelu_forward);
LOOM_REGISTER_KERNEL(gelu_backward_kernel, DeviceType::CPU, gelu_backward);

}  // namespace loom::cpu

namespace loom {
// The stubs live beside their CPU kernels (core/kernels.h, "transformer kernels").
LOOM_DEFINE_KERNEL(gelu_forward_kernel);
LOOM_DEFINE_KERNEL(gelu_backward_kernel);
}  // namespace loom
