// Pair: a 2-D size argument (kernel_size, stride, padding, dilation) given as one int or
// as two, as PyTorch's Conv2d(3, 64, 3) and Conv2d(3, 64, {3, 1}) both accept.
//
//   nn::Conv2d(3, 64, /*kernel=*/3);        // (3, 3)
//   nn::Conv2d(3, 64, /*kernel=*/{3, 1});   // (3, 1)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom::nn {

struct Pair {
  int64_t h = 0, w = 0;
  Pair(int64_t both) : h(both), w(both) {}  // NOLINT: implicit, as PyTorch's int-or-tuple
  Pair(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  std::vector<int64_t> vec() const { return {h, w}; }
  std::string str() const { return detail::str("(", h, ", ", w, ")"); }
  bool operator==(const Pair&) const = default;
};

}  // namespace loom::nn
