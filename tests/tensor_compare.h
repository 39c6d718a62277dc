// max_abs_diff: how far apart two same-shaped tensors are, the measure most tests compare with.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "core/tensor.h"  // defines: Tensor

namespace loom::testing {

// Largest |a - b| over two same-shaped tensors (any floating dtype, any device).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  auto x = a.to(kFloat64).tolist<double>(), y = b.to(kFloat64).tolist<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace loom::testing
