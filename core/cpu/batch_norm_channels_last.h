// The batch-norm passes of core/cpu/batch_norm.cpp for channels-last input.
//
// A channels-last [N, C, H, W] tensor is, in memory, an [N*H*W, C] matrix: one *row*
// per pixel, the C channels of a pixel next to each other (Note [Channels-last
// activations], core/memory_format.h). Instead of the NCHW kernels' planes (one channel
// of one sample, S contiguous elements), the loops here walk rows and vectorise across
// the channels of a row, keeping one accumulator per channel. Rows are taken in
// *groups* of up to kGroupRows consecutive rows; groups are split across OpenMP threads
// and play the part of the NCHW kernels' planes:
//
//   forward, training   pass 1, per group: per-channel sum, centre (the group's own
//                       mean) and sum of squares about it
//                       combine per channel (in double, over the groups in order)
//   forward             pass 2, per row: y = x * scale[c] + shift[c] (+ r, ReLU)
//   backward            pass 1, per group: sum(g), sum(g * (x - mean)) per channel
//                       pass 2, per row: dx = a[c] * g + b[c] * x + c0[c]
//
// The arithmetic is Note [Batch-norm accumulation]'s: a group's sums run in T over at
// most kGroupRows elements per channel, groups combine in double, and the variance is
// assembled from per-group centred sums, never from E[x^2] - E[x]^2. Only the grouping
// differs from NCHW (kGroupRows pixels, against one plane of H*W), so the two layouts
// agree to float rounding, not to the bit (tests/test_memory_format.cpp compares them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cpu/bf16_convert.h"  // defines: compute_t, widen, narrow_into
#include "core/tensor.h"

namespace loom::cpu::channels_last {

constexpr int64_t kGroupRows = 256;  // a group of 64-channel bfloat16 rows is 32 KiB: it stays in cache between passes
constexpr int64_t kParallelElements = 1 << 15;

struct RowLayout {
  int64_t rows, c;  // [rows, c]; rows = N * H * W
  int64_t groups() const { return (rows + kGroupRows - 1) / kGroupRows; }
  int64_t group_begin(int64_t g) const { return g * kGroupRows; }
  int64_t group_end(int64_t g) const { return std::min(rows, (g + 1) * kGroupRows); }
  bool parallel() const { return rows * c > kParallelElements && groups() > 1; }
};

// Per-channel batch mean and biased centred sum of squares.
template <typename E, typename T = compute_t<E>>
void batch_moments(const RowLayout& l, const E* x, std::vector<double>& mean, std::vector<double>& squares) {
  const int64_t C = l.c, G = l.groups();
  Tensor buffer = empty({3 * G * C}, TensorOptions(kFloat64));
  double* group_sum = buffer.data_ptr<double>();
  double* group_centre = group_sum + G * C;
  double* group_squares = group_centre + G * C;
#pragma omp parallel if (l.parallel())
  {
    std::vector<T> sum(static_cast<size_t>(C)), centre(static_cast<size_t>(C)), squares_t(static_cast<size_t>(C));
    T* su = sum.data();
    T* ce = centre.data();
    T* sq = squares_t.data();
#pragma omp for schedule(static)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t begin = l.group_begin(g), end = l.group_end(g);
      std::fill(sum.begin(), sum.end(), T(0));
      std::fill(squares_t.begin(), squares_t.end(), T(0));
      for (int64_t r = begin; r < end; ++r) {
        const E* xr = x + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) su[c] += widen(xr[c]);
      }
      const T count = static_cast<T>(end - begin);
      for (int64_t c = 0; c < C; ++c) ce[c] = su[c] / count;
      for (int64_t r = begin; r < end; ++r) {
        const E* xr = x + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const T d = widen(xr[c]) - ce[c];
          sq[c] += d * d;
        }
      }
      for (int64_t c = 0; c < C; ++c) {
        group_sum[g * C + c] = static_cast<double>(su[c]);
        group_centre[g * C + c] = static_cast<double>(ce[c]);
        group_squares[g * C + c] = static_cast<double>(sq[c]);
      }
    }
  }
  // sum (x - m)^2 = sum_g [ Q_g + 2 (c_g - m) (sum_g - n_g c_g) + n_g (c_g - m)^2 ]
  std::fill(mean.begin(), mean.end(), 0.0);
  std::fill(squares.begin(), squares.end(), 0.0);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < C; ++c) mean[static_cast<size_t>(c)] += group_sum[g * C + c];
  for (double& m : mean) m /= static_cast<double>(l.rows);
  for (int64_t g = 0; g < G; ++g) {
    const double n = static_cast<double>(l.group_end(g) - l.group_begin(g));
    for (int64_t c = 0; c < C; ++c) {
      const double shift = group_centre[g * C + c] - mean[static_cast<size_t>(c)];
      squares[static_cast<size_t>(c)] += group_squares[g * C + c] +
                                          2 * shift * (group_sum[g * C + c] - n * group_centre[g * C + c]) +
                                          n * shift * shift;
    }
  }
}

// y = x * scale[c] + shift[c] (+ r), then max(0, y) with kRelu.
template <typename E, bool kResidual, bool kRelu, typename T = compute_t<E>>
void normalise_rows(const RowLayout& l, const E* x, const T* scale, const T* shift, const E* r, E* y) {
  const int64_t C = l.c;
#pragma omp parallel for schedule(static) if (l.parallel())
  for (int64_t row = 0; row < l.rows; ++row) {
    const E* xr = x + row * C;
    E* yr = y + row * C;
    [[maybe_unused]] const E* rr = kResidual ? r + row * C : nullptr;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      T v = widen(xr[c]) * scale[c] + shift[c];
      if constexpr (kResidual) v += widen(rr[c]);
      if constexpr (kRelu) v = v > T(0) ? v : T(0);
      narrow_into(yr[c], v);
    }
  }
}

template <typename E, typename T = compute_t<E>>
void scale_shift(const RowLayout& l, const E* x, const std::vector<T>& scale, const std::vector<T>& shift,
                 const E* residual, bool relu, E* y) {
  const T* a = scale.data();
  const T* b = shift.data();
  if (residual != nullptr) {
    return relu ? normalise_rows<E, true, true>(l, x, a, b, residual, y)
                : normalise_rows<E, true, false>(l, x, a, b, residual, y);
  }
  return relu ? normalise_rows<E, false, true>(l, x, a, b, residual, y)
              : normalise_rows<E, false, false>(l, x, a, b, residual, y);
}

// The gradient reaching the normalisation: dy, or dy where the ReLU's output y > 0.
template <typename E, bool kRelu, typename T = compute_t<E>>
inline T incoming(const E* dy, const E* y, int64_t i) {
  const T g = widen(dy[i]);  // loaded unconditionally, as PlaneGrad in batch_norm.cpp
  if constexpr (kRelu) return widen(y[i]) > T(0) ? g : T(0);
  return g;
}

// Backward pass 1: per-channel sum(g) and sum(g * (x - mean)), combined in double; with
// `residual_grad`, g is written there first (the residual's gradient).
template <typename E, bool kRelu, typename T = compute_t<E>>
void backward_sums(const RowLayout& l, const E* dy, const E* y, const E* x, const T* mean, E* residual_grad,
                   std::vector<double>& sum_dy, std::vector<double>& dot) {
  const int64_t C = l.c, G = l.groups();
  Tensor buffer = empty({2 * G * C}, TensorOptions(kFloat64));
  double* group_dy = buffer.data_ptr<double>();
  double* group_dot = group_dy + G * C;
#pragma omp parallel if (l.parallel())
  {
    std::vector<T> sdy(static_cast<size_t>(C)), sdot(static_cast<size_t>(C));
    T* a = sdy.data();
    T* b = sdot.data();
#pragma omp for schedule(static)
    for (int64_t g = 0; g < G; ++g) {
      std::fill(sdy.begin(), sdy.end(), T(0));
      std::fill(sdot.begin(), sdot.end(), T(0));
      for (int64_t r = l.group_begin(g); r < l.group_end(g); ++r) {
        const E* xr = x + r * C;
        const E* dyr = dy + r * C;
        const E* yr = kRelu ? y + r * C : nullptr;
        if (residual_grad != nullptr) {
          E* gr = residual_grad + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) narrow_into(gr[c], incoming<E, kRelu>(dyr, yr, c));  // exact: dy or 0
        }
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const T gv = incoming<E, kRelu>(dyr, yr, c);
          a[c] += gv;
          b[c] += gv * (widen(xr[c]) - mean[c]);
        }
      }
      for (int64_t c = 0; c < C; ++c) {
        group_dy[g * C + c] = static_cast<double>(a[c]);
        group_dot[g * C + c] = static_cast<double>(b[c]);
      }
    }
  }
  std::fill(sum_dy.begin(), sum_dy.end(), 0.0);
  std::fill(dot.begin(), dot.end(), 0.0);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t c = 0; c < C; ++c) {
      sum_dy[static_cast<size_t>(c)] += group_dy[g * C + c];
      dot[static_cast<size_t>(c)] += group_dot[g * C + c];
    }
  }
}

// Backward pass 2: dx = a[c] * g + bx[c] * x + c0[c].
template <typename E, bool kRelu, typename T = compute_t<E>>
void backward_dx(const RowLayout& l, const E* dy, const E* y, const E* x, const std::vector<T>& a_,
                 const std::vector<T>& bx_, const std::vector<T>& c0_, E* dx) {
  const int64_t C = l.c;
  const T* a = a_.data();
  const T* bx = bx_.data();
  const T* c0 = c0_.data();
#pragma omp parallel for schedule(static) if (l.parallel())
  for (int64_t row = 0; row < l.rows; ++row) {
    const E* xr = x + row * C;
    const E* dyr = dy + row * C;
    const E* yr = kRelu ? y + row * C : nullptr;
    E* dxr = dx + row * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) narrow_into(dxr[c], a[c] * incoming<E, kRelu>(dyr, yr, c) + bx[c] * widen(xr[c]) + c0[c]);
  }
}

}  // namespace loom::cpu::channels_last
