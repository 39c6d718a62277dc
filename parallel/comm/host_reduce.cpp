#include "parallel/comm/host_reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace loom::distributed {

namespace {

// What a dtype is summed in: itself, except the 16-bit floats, which have no arithmetic
// of their own on the CPU (core/dtype.h) and are reduced in float32.
template <typename T> struct Accumulator { using type = T; };
template <> struct Accumulator<Half> { using type = float; };
template <> struct Accumulator<BFloat16> { using type = float; };

// Calls body.operator()<T>() with the C++ type of a reducible dtype (core/dtype.h's
// dispatch, after the check that leaves bool out).
template <typename F>
void dispatch_reducible(DType dtype, F&& body) {
  LOOM_CHECK(is_reducible(dtype), "the gloo backend reduces ", reducible_dtype_names(), " tensors, got ",
             dtype_name(dtype), "; convert with .to(kFloat32)");
  dispatch_any(dtype, "reduce", std::forward<F>(body));
}

// acc[i] = x[i] op y[i]; x may be acc itself.
template <typename Acc>
void combine(Acc* acc, const Acc* x, const Acc* y, size_t m, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      for (size_t i = 0; i < m; ++i) acc[i] = static_cast<Acc>(x[i] + y[i]);  // uint8 wraps, as PyTorch
      break;
    case ReduceOp::Max:
      for (size_t i = 0; i < m; ++i) acc[i] = x[i] < y[i] ? y[i] : x[i];
      break;
    case ReduceOp::Min:
      for (size_t i = 0; i < m; ++i) acc[i] = y[i] < x[i] ? y[i] : x[i];
      break;
  }
}

// Blocks of 4 KiB of accumulators stay in L1 between the passes: one reading pass over
// every source and one writing pass over every destination, however many there are.
template <typename T>
void reduce_typed(std::span<uint8_t* const> dsts, std::span<const uint8_t* const> srcs, size_t n, ReduceOp op,
                  int world) {
  using Acc = typename Accumulator<T>::type;
  constexpr size_t kBlock = 4096 / sizeof(Acc);
  Acc acc[kBlock];
  // A 16-bit source is converted into `widened` first; the first source goes to `acc`.
  Acc widened[std::is_same_v<Acc, T> ? 1 : kBlock];
  auto source = [&](size_t k, size_t lo, size_t m, Acc* into) -> const Acc* {
    const T* p = reinterpret_cast<const T*>(srcs[k]) + lo;
    if constexpr (std::is_same_v<Acc, T>) {
      return p;
    } else {
      for (size_t i = 0; i < m; ++i) into[i] = static_cast<Acc>(p[i]);
      return into;
    }
  };
  for (size_t lo = 0; lo < n; lo += kBlock) {
    const size_t m = std::min(kBlock, n - lo);
    const Acc* first = source(0, lo, m, acc);
    if (srcs.size() == 1 && first != acc) std::memcpy(acc, first, m * sizeof(Acc));
    // One source per pass, the first pass taking two (no copy of the first source):
    // loops simple enough for the compiler to vectorise.
    for (size_t k = 1; k < srcs.size(); ++k) combine(acc, k == 1 ? first : acc, source(k, lo, m, widened), m, op);
    if constexpr (!std::is_integral_v<Acc>) {
      if (op == ReduceOp::Avg) {
        const Acc w = static_cast<Acc>(world);
        for (size_t i = 0; i < m; ++i) acc[i] /= w;
      }
    }
    for (uint8_t* dst : dsts) {
      T* out = reinterpret_cast<T*>(dst) + lo;
      if constexpr (std::is_same_v<Acc, T>) {
        std::memcpy(out, acc, m * sizeof(T));
      } else {
        for (size_t i = 0; i < m; ++i) out[i] = T(acc[i]);
      }
    }
  }
}

}  // namespace

bool is_reducible(DType dtype) {
  return dtype == kFloat32 || dtype == kFloat64 || dtype == kFloat16 || dtype == kBFloat16 || dtype == kInt32 ||
         dtype == kInt64 || dtype == kUInt8;
}

const char* reducible_dtype_names() { return "float32, float64, float16, bfloat16, int32, int64 and uint8"; }

void reduce(DType dtype, std::span<uint8_t* const> dsts, std::span<const uint8_t* const> srcs, size_t n,
            ReduceOp op, int world) {
  if (n == 0) return;
  LOOM_CHECK(!srcs.empty(), "reduce: no sources");
  dispatch_reducible(dtype, [&]<typename T>() { reduce_typed<T>(dsts, srcs, n, op, world); });
}

}  // namespace loom::distributed
