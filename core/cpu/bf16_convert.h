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
// bfloat16 is the top half of a float32, so widening is a 16-bit shift, and narrowing
// is round-to-nearest-even on the dropped 16 bits (add 0x7fff plus the lowest kept bit,
// then shift) with NaN mapped to the canonical quiet NaN 0x7fc0 -- bit for bit what
// BFloat16(float) in core/dtype.cpp, PyTorch's c10::BFloat16 and oneDNN do. Written
// inline as integer arithmetic with a mask select rather than calling dtype.cpp's
// out-of-line conversion, the compiler vectorises both directions with the loop around
// them (AVX2: zero-extend + shift to widen; add, shift, compare/blend and pack to
// narrow), so a bfloat16 kernel makes one pass over memory and moves half the bytes of
// the float32 one. Instead of staging (Note [16-bit CPU kernels stage through float32])
// it needs no float32 copies at all. (AVX512-BF16's vcvtne2ps2bf16 narrows in one
// instruction, but the build targets x86-64-v3, see meson.build, and these kernels are
// bound by memory, not by the conversion.)
#pragma once

#include <bit>          // defines: std::bit_cast
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
inline float bf16_to_float(const BFloat16& x) { return std::bit_cast<float>(static_cast<uint32_t>(x.bits) << 16); }

// See Note [bfloat16 conversion in registers].
// The NaN case is selected with a mask, not a ?: -- GCC kept the latter as a branch in
// some loops, which then did not vectorise.
inline uint16_t bf16_bits(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);  // all ones for NaN
  return static_cast<uint16_t>((rounded & ~nan) | (0x7fc0u & nan));
}

inline BFloat16 float_to_bf16(float v) {
  BFloat16 out;
  out.bits = bf16_bits(v);
  return out;
}

template <typename T> inline compute_t<T> widen(const T& x) {
  if constexpr (std::is_same_v<T, BFloat16>) return bf16_to_float(x);
  else if constexpr (std::is_same_v<T, Half>) return static_cast<float>(x);
  else return x;
}

// T from a value of its compute type (or any arithmetic value, converted first).
template <typename T, typename S> inline T narrow(S v) {
  if constexpr (std::is_same_v<T, BFloat16>) return float_to_bf16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, Half>) return Half(static_cast<float>(v));
  else return static_cast<T>(v);
}

// dst = narrow<T>(v), for stores in `omp simd` loops: a BFloat16 returned by value and
// assigned there is an aggregate store GCC does not vectorise; its bits are a plain one.
template <typename T, typename S> inline void narrow_into(T& dst, S v) {
  if constexpr (std::is_same_v<T, BFloat16>) dst.bits = bf16_bits(static_cast<float>(v));
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
