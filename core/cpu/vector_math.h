// vector_math: exp and erf for float32 written so that the compiler vectorises the loops
// that call them, with std::exp / std::erf for every other type.
//
// Note [Vectorisable exp and erf]
// A loop that calls std::exp or std::erf on floats stays scalar: glibc's functions are
// opaque calls (its vector variants need -ffast-math), so the compiler runs one element
// per call. In a ViT-tiny training step that was a sixth of the time: exact GELU calls
// erf forward and erf plus exp backward on every element of the MLP's hidden layer, and
// attention's online softmax calls exp on every score. exp_f32 and erfc_f32 are plain
// arithmetic on floats and ints with selects instead of branches, so an `omp simd` loop
// (cpu_map_typed's, attention's) runs them 8 or 16 lanes at a time.
//
//   exp_f32(x): Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2 (ln2 split in two parts
//     so that n ln2 is exact), e^r by Cephes' expf polynomial, 2^n put straight into the
//     exponent bits. Within 1 ulp of exp(x) over [-87, 88] (measured against float64 in
//     steps of 7e-4); 0 below -87.3 and for -inf (masked attention scores), +inf above
//     88.7, NaN for NaN.
//   erfc_f32(x): Numerical Recipes' Chebyshev fit erfc(z) = t exp(-z^2 + P(t)),
//     t = 1 / (1 + z/2), z = |x|, fractional error below 1.2e-7 as a formula; in float32
//     below 8e-6 relative over [-9, 9], the most far out in the tail, where the rounding
//     of z^2 inside exp shows. GELU needs erfc rather than erf: x Phi(x) =
//     x erfc(-x / sqrt 2) / 2 keeps its relative accuracy for negative x, where
//     x (1 + erf(x / sqrt 2)) / 2 cancels (in float32 that form returns 0 below x = -5.9,
//     where GELU is -1e-8 and less).
// Float64 (the gradient checks) keeps std::exp and std::erfc.
#pragma once

#include <bit>      // defines: std::bit_cast
#include <cmath>    // defines: std::exp, std::erf
#include <cstdint>  // defines: int32_t
#include <type_traits>  // defines: std::is_same_v

namespace loom::cpu {

inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // Cephes' split of ln 2
  constexpr float kMax = 88.7228317f, kMin = -87.3365448f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // Every comparison and every value below is computed unconditionally and only then
  // selected: a comparison or an arithmetic op inside one arm of a ?: is conditional
  // work the compiler must not speculate (it may raise a floating-point exception), and
  // it then leaves the loop scalar.
  const float upper = x > kMax ? kMax : x;
  const float clamped = upper >= kMin ? upper : kMin;  // NaN -> kMin, put back below
  const float n = (clamped * kLog2e + kRound) - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n in the exponent field; n is in [-126, 128] after the clamp, so split it in two
  // halves that are each a normal power of two (2^128 alone would be inf).
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t half = ni >> 1;
  const float scale_a = std::bit_cast<float>((half + 127) << 23);
  const float scale_b = std::bit_cast<float>((ni - half + 127) << 23);
  const float scaled = p * scale_a * scale_b;
  const bool above = x > kMax, below = x < kMin, is_nan = x != x;
  const float high = above ? HUGE_VALF : scaled;
  const float low = below ? 0.0f : high;
  return is_nan ? x : low;
}

inline float erfc_f32(float x) {
  const float z = std::fabs(x);
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float tail = t * exp_f32(p - z * z);  // erfc(|x|)
  const float reflected = 2.0f - tail;         // erfc(-|x|); both arms computed: see exp_f32
  const bool negative = x < 0.0f;
  return negative ? reflected : tail;
}

// exp and erf for loops over any floating type: the float32 forms above, std's otherwise.
template <typename T>
inline T vector_exp(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}

template <typename T>
inline T vector_erfc(T x) {
  if constexpr (std::is_same_v<T, float>) return erfc_f32(x);
  else return std::erfc(x);
}

}  // namespace loom::cpu
