// What tests of same-host collectives share (tests/test_comm_shm.cpp,
// tests/test_comm_symmetric.cpp): rank r's element i, small integers that are exact in
// every dtype and differ on every rank; the result each ReduceOp must give; and how many
// shared-memory segments this process has left in /dev/shm.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/factory.h"
#include "parallel/comm/op.h"

namespace loom::testing {

inline double value(int r, int64_t i) { return double((i * 7 + r * 13) % 23) - 11.0 + r; }

inline double expected(distributed::ReduceOp op, int world, int64_t i) {
  double sum = 0, hi = -1e300, lo = 1e300;
  for (int r = 0; r < world; ++r) {
    sum += value(r, i);
    hi = std::max(hi, value(r, i));
    lo = std::min(lo, value(r, i));
  }
  switch (op) {
    case distributed::ReduceOp::Sum: return sum;
    case distributed::ReduceOp::Avg: return sum / world;
    case distributed::ReduceOp::Max: return hi;
    case distributed::ReduceOp::Min: return lo;
  }
  return 0;
}

inline Tensor values_of(int r, int64_t n, DType dtype, int64_t salt = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(r, i + salt);
  return from_vector<double>(v, {n}).to(dtype);
}

// Named segments in /dev/shm that this process created ("/loom-<pid>-...", see
// unique_segment_name): other test programs running at the same time have their own.
inline size_t loom_segments_in_dev_shm() {
  const std::string mine = "loom-" + std::to_string(::getpid()) + "-";
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
    if (entry.path().filename().string().rfind(mine, 0) == 0) ++n;
  return n;
}

}  // namespace loom::testing
