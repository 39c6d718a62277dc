// Comparing a tensor computed on one device with one computed on another (the CUDA
// tests: GPU result against the CPU backend's on the same inputs), and moving them there.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/copy.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"

namespace loom::testing {

inline const Device kCpu("cpu");
inline const Device kCuda0("cuda:0");

// t copied to `device` as `dtype` (converted on the way); undefined stays undefined.
inline Tensor to_device(const Tensor& t, Device device, DType dtype) {
  if (!t.defined()) return t;
  Tensor out = empty(t.shape(), TensorOptions(dtype).device(device));
  copy_into(out, t);
  return out;
}
inline Tensor to_device(const Tensor& t, Device device) { return to_device(t, device, t.dtype()); }
inline Tensor gpu_empty(const Shape& shape, DType dtype) { return empty(shape, TensorOptions(dtype).device(kCuda0)); }

// The tensor's values as float64 on the host, whatever its device and dtype.
inline std::vector<double> host_values(const Tensor& t) {
  Tensor host = empty(t.shape(), TensorOptions(kFloat64));
  copy_into(host, t);
  return host.tolist<double>();
}

// max |a - b| / max |b| over every element, in float64 on the host: the error of a
// reduced-precision result against a reference, relative to the reference's scale.
inline double rel_error(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = host_values(a.detach()), y = host_values(b.detach());
  REQUIRE(x.size() == y.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / std::max(scale, 1e-30);
}

// Random CPU values in [low, high) (integers for int64).
inline Tensor random_cpu(const Shape& shape, DType dtype, double low, double high, uint64_t seed) {
  Generator gen(seed);
  if (dtype == kInt64) return randint(static_cast<int64_t>(low), static_cast<int64_t>(high), shape, kInt64, &gen);
  Tensor t = empty(shape, TensorOptions(dtype));
  uniform_kernel(Device("cpu"))(t, low, high, gen);
  return t;
}

// |got - expected| <= atol + rtol * |expected| everywhere (NaN matches NaN); one CHECK,
// naming the first mismatch.
inline void check_close(const Tensor& got, const Tensor& expected, double rtol, double atol = 0.0) {
  REQUIRE(got.shape() == expected.shape());
  const auto g = host_values(got), e = host_values(expected);
  int64_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool both_nan = std::isnan(g[i]) && std::isnan(e[i]);
    if (both_nan || std::abs(g[i] - e[i]) <= atol + rtol * std::abs(e[i])) continue;
    if (mismatches++ == 0) first = detail::str("element ", i, ": got ", g[i], ", expected ", e[i]);
  }
  INFO(mismatches, " of ", g.size(), " elements differ; first: ", first);
  CHECK(mismatches == 0);
}

// ||got - expected|| <= tol * ||expected|| (2-norms). For gradients through ReLUs, or a
// deep net's: an activation within float noise of zero may switch sides between the
// devices, which changes a few gradient entries by one whole term each, beyond any
// per-element bound that would still catch a wrong kernel, but moves the norm of the
// difference little.
inline void check_close_norm(const std::string& what, const Tensor& got, const Tensor& expected, double tol) {
  const std::vector<double> g = host_values(got), e = host_values(expected);
  REQUIRE(g.size() == e.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    diff += (g[i] - e[i]) * (g[i] - e[i]);
    norm += e[i] * e[i];
  }
  INFO(what, ": |got - expected| = ", std::sqrt(diff), ", |expected| = ", std::sqrt(norm));
  CHECK(std::sqrt(diff) <= tol * std::sqrt(norm) + 1e-30);
}

}  // namespace loom::testing
