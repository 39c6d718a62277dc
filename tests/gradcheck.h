// gradcheck: compares autograd's gradients with central finite differences, in float64.
//
// The scalar checked is L = sum(f(inputs) * w) with fixed random weights w, so every
// output element's gradient matters (a plain sum would hide errors that cancel).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace loom::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs must be float64, contiguous, on CPU; those with requires_grad are checked.
inline void gradcheck(const Fn& f, const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-6,
                      double rtol = 1e-4) {
  Generator gen(1234);
  Tensor probe = f(inputs);
  REQUIRE(probe.dtype() == kFloat64);
  Tensor weights = randn(probe.shape(), TensorOptions(kFloat64), &gen);
  auto objective = [&]() { return sum(f(inputs) * weights); };

  for (const Tensor& input : inputs) {
    if (input.requires_grad()) input.set_grad(Tensor());
  }
  objective().backward();

  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& input = inputs[k];
    if (!input.requires_grad()) continue;
    REQUIRE(input.is_contiguous());
    Tensor analytic = input.grad();
    REQUIRE_MESSAGE(analytic.defined(), "input ", k, " got no gradient");
    REQUIRE(analytic.shape() == input.shape());
    auto analytic_values = analytic.contiguous().tolist<double>();
    double* x = input.data_ptr<double>();
    for (int64_t i = 0; i < input.numel(); ++i) {
      const double saved = x[i];
      x[i] = saved + eps;
      double plus = objective().item<double>();
      x[i] = saved - eps;
      double minus = objective().item<double>();
      x[i] = saved;
      double numeric = (plus - minus) / (2 * eps);
      double got = analytic_values[static_cast<size_t>(i)];
      bool close = std::abs(got - numeric) <= atol + rtol * std::abs(numeric);
      if (!close) {
        FAIL_CHECK("gradient mismatch for input ", k, " element ", i, ": analytic ", got, " vs numeric ", numeric);
        return;
      }
    }
  }
}

// A float64 leaf with values from a seeded normal distribution.
inline Tensor leaf(const Shape& shape, uint64_t seed = 7, double scale = 1.0) {
  Generator gen(seed);
  Tensor t = randn(shape, TensorOptions(kFloat64), &gen);
  if (scale != 1.0) t = t * scale;
  return t.detach().requires_grad_(true);
}

}  // namespace loom::testing
