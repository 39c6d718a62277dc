// bfloat16 <-> float in registers, for CPU kernels that run on 16-bit floats directly.
//
//   const float v = widen(x[i]);          // x: const BFloat16*  (float, double: unchanged)
//   y[i] = narrow<BFloat16>(v * a + b);   // one rounding per result
//
// A kernel written on `compute_t<T>` with widen/narrow at its loads and stores serves
// float, double, bfloat16 and float16 from one body; dispatch_floating_16bit
// instantiates it for the four (the names are cuda/loops.cuh's, so a CPU kernel and its
// CUDA twin read alike). float16 converts through core/dtype.cpp's out-of-line Half
// conversions: correct and one pass, but scalar; bfloat16 is the fast path.
//
// Note [bfloat16 conversion in registers]
// bfloat16 converts with BFloat16's inline, branch-free conversions (core/dtype.h: a
// shift to widen; round to nearest even with a NaN mask to narrow). Inline, the compiler
// vectorises both directions with the loop around them (AVX2: zero-extend + shift to
// widen; add, shift, compare/blend and pack to narrow), so a bfloat16 kernel makes one
// pass over memory and moves half the bytes of the float32 one. Instead of staging (Note
// [16-bit CPU kernels stage through float32]) it needs no float32 copies at all.
// narrow_into stores the 16 bits alone rather than a whole struct, which GCC would not
// vectorise. (AVX512-BF16's vcvtne2ps2bf16 narrows in one instruction, but the build
// targets x86-64-v3, see meson.build, and these kernels are bound by memory, not by the
// conversion.)
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>      // defines: std::forward

#include "core/dtype.h"  // defines: BFloat16, Half, dispatch_floating

namespace loom::cpu {

// The type arithmetic on T happens in: float for bfloat16, T itself otherwise.
template <typename T> struct Compute { using type = T; };
template <> struct Compute<BFloat16> { using type = float; };
template <> struct Compute<Half> { using type = float; };
template <typename T> using compute_t = typename Compute<T>::type;

// By reference: a BFloat16 copied by value inside an `omp simd` loop became an
// aggregate temporary that GCC could not vectorise ("complicated access pattern").
template <typename T> inline compute_t<T> widen(const T& x) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) return static_cast<float>(x);
  else return x;
}

// T from a value of its compute type (or any arithmetic value, converted first).
template <typename T, typename S> inline T narrow(S v) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Half>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

// dst = narrow<T>(v), for stores in `omp simd` loops: a BFloat16 returned by value and
// assigned there is an aggregate store GCC does not vectorise; its bits are a plain one.
template <typename T, typename S> inline void narrow_into(T& dst, S v) {
  if constexpr (std::is_same_v<T, BFloat16>) dst.bits = BFloat16::round_to_bits(static_cast<float>(v));
  else dst = narrow<T>(v);
}

// dispatch_floating (core/dtype.h) plus the 16-bit floats: the lambda runs with
// T = float, double, BFloat16 or Half and computes in compute_t<T>.
template <typename F>
decltype(auto) dispatch_floating_16bit(DType dtype, const char* op, F&& body) {
  if (dtype == kBFloat16) return body.template operator()<BFloat16>();
  if (dtype == kFloat16) return body.template operator()<Half>();
  return dispatch_floating(dtype, op, std::forward<F>(body));
}

}  // namespace loom::cpu
