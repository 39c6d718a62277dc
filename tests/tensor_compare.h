// max_abs_diff and relative_error: how far apart two same-shaped tensors are, the measures
// tests compare with.
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

// max |a - b| / (offset + max |b|): a float32 result against a float64 one of the same sums.
// offset 1 keeps results near zero from dividing by almost nothing.
inline double relative_error(const Tensor& a, const Tensor& b, double offset = 0.0) {
  auto x = a.to(kFloat64).contiguous().tolist<double>();
  auto y = b.to(kFloat64).contiguous().tolist<double>();
  REQUIRE(x.size() == y.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / (offset + scale);
}

}  // namespace loom::testing
