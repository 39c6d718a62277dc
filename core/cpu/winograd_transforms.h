// The tile transforms of Winograd's minimal filtering, F(m x m, 3 x 3), for m = 4 and 2.
//
// Note [Winograd tiles]
// A 3x3 convolution's output, cut into m x m tiles, is computed tile by tile from the
// (m+2) x (m+2) input tile under it (alpha = m + 2):
//
//        Y = A^T [ (G g G^T)  (.)  (B^T d B) ] A        (.) elementwise, alpha x alpha
//            m x m  filter U        input V
//
// Across channels the elementwise product becomes, for each of the alpha^2 positions p,
// a matrix product M[p] (O x tiles) = U[p] (O x C) . V[p] (C x tiles): alpha^2 GEMMs that
// together cost alpha^2 / (9 m^2) of the direct convolution's multiplies -- 36/144 = 1/4
// for F(4x4) and 16/36 for F(2x2). The transforms themselves are additions and a few
// multiplies by small constants per element; this file computes them for kLanes tiles at
// once (one AVX2 register of floats per entry), so that they cost a small fraction of
// the GEMMs.
//
// The matrices are Lavin and Gray's construction (arXiv:1509.09308), interpolation points
// 0, +-1, 2, -1/2 and infinity for F(4x4) and 0, +-1, infinity for F(2x2). Both gradients
// are transforms of the same kind (Note [Winograd gradients], winograd_conv2d.cpp).
//
// Note [Filter transforms in float64]
// G holds thirds and fifteenths, which float32 rounds: with float32 coefficients the
// filters U = G g G^T, and the weight gradient G^T dU G, are those of a slightly different
// G, and each transform rounds once per addition on top. The filter transforms therefore
// run in float64 (whose G is off by ~1e-17) and round to float32 once, at the end. They
// touch each filter once per pass (O x C x 36 values, against the sgemms' O x C x 36 x
// tiles), so the cost does not show. On tests/test_winograd.cpp's SGD step (three threads) they took the w2 update's
// error from 5.4e-7 to 2.6e-7 from float64, and w1's with Note [Weight-gradient sums in
// short runs] (winograd_blocking.h) from 1.04e-6 to 7.8e-7 (bench/winograd_error_torch.py).
// B^T and A^T hold halves, quarters and eighths, exact in float32, so the tile transforms
// stay in float32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cpu/conv2d_reference.h"  // defines: Conv2dGeometry

namespace loom::cpu::winograd {

// Tiles per vector: 8 floats fill one AVX2 register (the build's baseline, x86-64-v3).
constexpr int kLanes = 8;

template <int M>
struct Matrices;

template <>
struct Matrices<4> {
  static constexpr int kAlpha = 6;
  static constexpr float BT[6][6] = {{1, 1.5f, -2, -1.5f, 1, 0},    {0, -1, -2.5f, -0.5f, 1, 0},
                                     {0, 1, 0.5f, -2.5f, 1, 0},     {0, -0.5f, -1, 0.5f, 1, 0},
                                     {0, 2, -1, -2, 1, 0},          {0, 1, 1.5f, -2, -1.5f, 1}};
  static constexpr double G[6][3] = {{1, 0, 0},  // See Note [Filter transforms in float64]
                                     {-1.0 / 3, -1.0 / 3, -1.0 / 3},
                                     {1.0 / 3, -1.0 / 3, 1.0 / 3},
                                     {1.0 / 15, 2.0 / 15, 4.0 / 15},
                                     {-16.0 / 15, 8.0 / 15, -4.0 / 15},
                                     {0, 0, 1}};
  static constexpr float AT[4][6] = {
      {1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -0.5f, 0}, {0, 1, 1, 4, 0.25f, 0}, {0, 1, -1, 8, -0.125f, 1}};
};

template <>
struct Matrices<2> {
  static constexpr int kAlpha = 4;
  static constexpr float BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  static constexpr float AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
};

// The transpose of a constant matrix, itself a constant (the weight gradient's output
// transform multiplies by A = (A^T)^T).
template <int R, int K, typename T = float>
struct Transposed {
  T m[K][R];
  constexpr explicit Transposed(const T (&a)[R][K]) : m() {
    for (int r = 0; r < R; ++r)
      for (int k = 0; k < K; ++k) m[k][r] = a[r][k];
  }
};

// y = A x A^T for a K x K tile x of lane vectors (x[i * K + k][lane]) and a constant
// R x K matrix A, giving an R x R tile y, in the arithmetic of T (float, or double for the
// filters: Note [Filter transforms in float64]). The loops are unrolled so that each
// coefficient is a compile-time constant: zeros drop out and ones cost nothing, which
// is what makes a transform a handful of vector additions rather than a dense product.
template <int R, int K, typename T = float>
[[gnu::always_inline]] inline void transform_tile(const T (&a)[R][K], const T* x, T* y) {
  T t[R * K][kLanes];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) {
      T acc[kLanes] = {};
#pragma GCC unroll 8
      for (int i = 0; i < K; ++i) {
        const T coefficient = a[r][i];
        if (coefficient == 0) continue;
        for (int l = 0; l < kLanes; ++l) acc[l] += coefficient * x[(i * K + k) * kLanes + l];
      }
      for (int l = 0; l < kLanes; ++l) t[r * K + k][l] = acc[l];
    }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int s = 0; s < R; ++s) {
      T acc[kLanes] = {};
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) {
        const T coefficient = a[s][k];
        if (coefficient == 0) continue;
        for (int l = 0; l < kLanes; ++l) acc[l] += coefficient * t[r * K + k][l];
      }
      for (int l = 0; l < kLanes; ++l) y[(r * R + s) * kLanes + l] = acc[l];
    }
}

// The filter transforms, the same for either activation layout.

// U[p] = (G g G^T)[p] for every filter g of a convolution from `cols` to `rows` channels:
// weight[o, c] itself (rows = O, cols = C), or for the input gradient (Note [Winograd
// gradients]) weight[o, c] flipped (rows = C, cols = O). Each position's matrix is
// rows x cols (U[p][r][s]), or with `transposed` cols x rows (U[p][s][r], what the
// channels-last passes multiply by: Note [Winograd in channels-last]). Consecutive
// entries of a position's matrix are the lanes, so its stores are contiguous. Computed
// in float64 (Note [Filter transforms in float64]).
template <int M>
inline void transform_filters(const Conv2dGeometry& g, const float* weight, bool flip, float* u,
                              bool transposed = false) {
  constexpr int A = M + 2;
  const int64_t rows = flip ? g.c : g.o, cols = flip ? g.o : g.c, total = rows * cols;
#pragma omp parallel for schedule(static)
  for (int64_t f = 0; f < total; f += kLanes) {
    alignas(32) double d[9 * kLanes];
    alignas(32) double out[A * A * kLanes];
    const int64_t lanes = std::min<int64_t>(kLanes, total - f);
    for (int l = 0; l < kLanes; ++l) {
      if (l >= lanes) {
        for (int e = 0; e < 9; ++e) d[e * kLanes + l] = 0.0;
        continue;
      }
      const int64_t r = transposed ? (f + l) % rows : (f + l) / cols, s = transposed ? (f + l) / rows : (f + l) % cols;
      if (!flip) {  // r = o, s = c
        for (int e = 0; e < 9; ++e) d[e * kLanes + l] = weight[(r * g.c + s) * 9 + e];
      } else {  // r = c, s = o
        for (int e = 0; e < 9; ++e) d[e * kLanes + l] = weight[(s * g.c + r) * 9 + 8 - e];
      }
    }
    transform_tile<A, 3, double>(Matrices<M>::G, d, out);
    for (int p = 0; p < A * A; ++p)
      for (int l = 0; l < lanes; ++l) u[p * total + f + l] = static_cast<float>(out[p * kLanes + l]);
  }
}

// grad_weight[o, c] = G^T dU[o, c] G (Note [Winograd gradients]), in float64 (Note
// [Filter transforms in float64]).
template <int M>
inline void inverse_transform_filters(const Conv2dGeometry& g, const float* du, float* grad_weight) {
  constexpr int A = M + 2;
  static constexpr Transposed<A, 3, double> kGT(Matrices<M>::G);
  const int64_t total = g.o * g.c;
#pragma omp parallel for schedule(static)
  for (int64_t f = 0; f < total; f += kLanes) {
    alignas(32) double d[A * A * kLanes];
    alignas(32) double out[9 * kLanes];
    const int64_t lanes = std::min<int64_t>(kLanes, total - f);
    for (int p = 0; p < A * A; ++p) {
      for (int l = 0; l < lanes; ++l) d[p * kLanes + l] = du[p * total + f + l];
      std::fill(d + p * kLanes + lanes, d + (p + 1) * kLanes, 0.0);
    }
    transform_tile<3, A, double>(kGT.m, d, out);
    for (int l = 0; l < lanes; ++l)
      for (int e = 0; e < 9; ++e) grad_weight[(f + l) * 9 + e] = static_cast<float>(out[e * kLanes + l]);
  }
}

}  // namespace loom::cpu::winograd
