// What two training runs that must train alike are compared on: the weights they saved
// (--save), tensor by tensor, bit for bit, and their progress line.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/tensor.h"     // defines: Tensor, kFloat64
#include "nn/safetensors.h"  // defines: safetensors::load_file

namespace loom::testing {

// The two files hold the same tensors under the same names, equal to the bit.
inline void check_same_weights(const std::string& want, const std::string& got) {
  auto a = safetensors::load_file(want), b = safetensors::load_file(got);
  REQUIRE(a.size() == b.size());
  for (const auto& [key, tensor] : a) {
    const std::string& name = key;  // See Note [doctest messages name no structured binding]
    const Tensor* other = b.find(name);
    REQUIRE_MESSAGE(other != nullptr, "missing ", name);
    CHECK_MESSAGE(tensor.to(kFloat64).tolist<double>() == other->to(kFloat64).tolist<double>(), name, " differs");
  }
}

// The largest |difference| between two files' tensors, which must have the same names and
// shapes: for runs that compute the same thing with sums in another order (tensor
// parallelism's all-reduces), where bits may differ but not more than rounding.
inline double max_weight_difference(const std::string& want, const std::string& got) {
  auto a = safetensors::load_file(want), b = safetensors::load_file(got);
  REQUIRE(a.size() == b.size());
  double most = 0;
  for (const auto& item : a) {
    const std::string& name = item.first;  // See Note [doctest messages name no structured binding]
    const Tensor& tensor = item.second;
    const Tensor* other = b.find(name);
    REQUIRE_MESSAGE(other != nullptr, "missing ", name);
    REQUIRE_MESSAGE(other->shape() == tensor.shape(), name, ": shape ", other->shape(), ", expected ", tensor.shape());
    const auto x = tensor.to(kFloat64).tolist<double>(), y = other->to(kFloat64).tolist<double>();
    for (size_t i = 0; i < x.size(); ++i) most = std::max(most, std::abs(x[i] - y[i]));
  }
  return most;
}

// train_cifar10's "epoch 1/N  train loss ...  test acc ..." line without its timing (the
// whole output if it has none, so that a failed comparison shows why).
inline std::string progress_line(const std::string& out) {
  const auto start = out.find("epoch 1/");
  return start == std::string::npos ? out : out.substr(start, out.find(" time", start) - start);
}

}  // namespace loom::testing
