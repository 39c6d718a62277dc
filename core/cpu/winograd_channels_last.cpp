// loom's Winograd convolution on channels-last (NHWC) activations; see
// core/cpu/winograd_channels_last.h.
//
// Note [Winograd in channels-last]
// In NCHW a channel's pixels are contiguous, so the NCHW passes put kLanes *tiles* of one
// channel in the vector lanes, and each position's sgemm is M[p] (O x tiles) = U[p] (O x C)
// . V[p] (C x tiles). In NHWC a pixel's channels are contiguous, so here the lanes are
// kLanes *channels* of one tile: a tile's gather is (alpha^2) 32-byte loads, its scatter as
// many stores, with no transposition. The matrices turn around to match, tiles x channels:
//   forward          M[p] (tiles x O) = V[p] (tiles x C) . U[p]^T
//   weight gradient  dU[p] (O x C)    = dM[p]^T (O x tiles) . V[p] (tiles x C)
// The filter transforms U and the blocking (Note [Winograd blocking]) are the NCHW
// passes' own; the whole-batch case splits its transforms over tiles instead of channels.
// This is what lets a network keep its activations channels-last on AVX2 CPUs, from the
// stem to the pooling, with no reorder around any convolution (Note [Conv2d memory
// layout], core/cpu/conv2d.cpp).
#include "core/cpu/winograd_channels_last.h"

#include <cblas.h>  // defines: cblas_sgemm (single-threaded inside our parallel region: Note [BLAS threads])
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/winograd_blocking.h"    // defines: Tiling, block_tiles, whole_batch (Note [Winograd blocking])
#include "core/cpu/winograd_transforms.h"  // defines: Matrices, transform_tile, inverse_transform_filters
#include "core/factory.h"                  // defines: empty (workspace from the caching allocator)

namespace loom::cpu::winograd {
namespace {

// Gathers the Side x Side patch with top-left pixel (y0, x0) of one NHWC image, channels
// [c, c + lanes), into d[i * Side + k][lane]: zero outside the image and in lanes past
// `lanes`.
template <int Side>
inline void gather_patch(const float* image, int64_t h, int64_t w, int64_t channels, int64_t y0, int64_t x0,
                         int64_t c, int64_t lanes, float* d) {
  if (lanes == kLanes && y0 >= 0 && x0 >= 0 && y0 + Side <= h && x0 + Side <= w) {  // interior: plain loads
    for (int i = 0; i < Side; ++i)
      for (int k = 0; k < Side; ++k)
        std::memcpy(d + (i * Side + k) * kLanes, image + ((y0 + i) * w + x0 + k) * channels + c,
                    sizeof(float) * kLanes);
    return;
  }
  for (int i = 0; i < Side; ++i)
    for (int k = 0; k < Side; ++k) {
      const int64_t y = y0 + i, x = x0 + k;
      const bool inside = y >= 0 && y < h && x >= 0 && x < w;
      float* dst = d + (i * Side + k) * kLanes;
      for (int l = 0; l < kLanes; ++l) dst[l] = inside && l < lanes ? image[(y * w + x) * channels + c + l] : 0.f;
    }
}

// The rows of one block's matrices: tiles [first, last) of the tiling are rows
// [first - row0, last - row0) of `rows` in each position's rows x channels matrix.
struct Rows {
  int64_t first, last, row0, rows;
};

// out[p][t][c] = (T x T^T)[p] for the tiles' K x K patches of x, each starting `shift`
// pixels up and left of its output tile, eight channels at a time (T: alpha x K).
template <int A, int K>
void transform_patches(const float (&transform)[A][K], int shift, const Conv2dGeometry& g, int64_t channels,
                       const float* x, const Tiling& tiling, Rows r, float* out_rows) {
  alignas(32) float d[K * K * kLanes];
  alignas(32) float out[A * A * kLanes];
  for (int64_t t = r.first; t < r.last; ++t) {
    const TileRef tile = tiling.at(t);
    const float* image = x + tile.n * g.h * g.w * channels;
    float* row = out_rows + (t - r.row0) * channels;
    for (int64_t c = 0; c < channels; c += kLanes) {
      const int64_t lanes = std::min<int64_t>(kLanes, channels - c);
      gather_patch<K>(image, g.h, g.w, channels, tile.y - shift, tile.x - shift, c, lanes, d);
      transform_tile<A, K>(transform, d, out);
      for (int p = 0; p < A * A; ++p)
        std::memcpy(row + p * r.rows * channels + c, out + p * kLanes, sizeof(float) * lanes);
    }
  }
}

// V[p][t][c] = (B^T d B)[p] for the tiles' 6x6 or 4x4 input patches (one pixel up and left
// of the output tile: the padding).
template <int M>
void transform_input(const Conv2dGeometry& g, int64_t channels, const float* x, const Tiling& tiling, Rows r,
                     float* v) {
  transform_patches<M + 2, M + 2>(Matrices<M>::BT, 1, g, channels, x, tiling, r, v);
}

// dM[p][t][o] = (A dY A^T)[p] for the tiles' m x m grad_out patches (Note [Winograd gradients]).
template <int M>
void transform_grad_out(const Conv2dGeometry& g, int64_t channels, const float* grad_out, const Tiling& tiling,
                        Rows r, float* dm) {
  static constexpr Transposed<M, M + 2> kA(Matrices<M>::AT);
  transform_patches<M + 2, M>(kA.m, 0, g, channels, grad_out, tiling, r, dm);
}

// out tile = A^T M A (+ bias), stored into the NHWC output where it lies in the image.
template <int M>
void transform_output(const Conv2dGeometry& g, int64_t channels, const float* m, const Tiling& tiling, Rows r,
                      const float* bias, float* out) {
  constexpr int A = M + 2;
  alignas(32) float d[A * A * kLanes];
  alignas(32) float y[M * M * kLanes];
  for (int64_t t = r.first; t < r.last; ++t) {
    const TileRef tile = tiling.at(t);
    float* image = out + tile.n * g.h * g.w * channels;
    const float* row = m + (t - r.row0) * channels;
    const int64_t rows = std::min<int64_t>(M, g.h - tile.y), cols = std::min<int64_t>(M, g.w - tile.x);
    for (int64_t o = 0; o < channels; o += kLanes) {
      const int64_t lanes = std::min<int64_t>(kLanes, channels - o);
      for (int p = 0; p < A * A; ++p) {
        std::memcpy(d + p * kLanes, row + p * r.rows * channels + o, sizeof(float) * lanes);
        std::fill(d + p * kLanes + lanes, d + (p + 1) * kLanes, 0.f);
      }
      transform_tile<M, A>(Matrices<M>::AT, d, y);
      float b[kLanes];
      for (int l = 0; l < kLanes; ++l) b[l] = bias != nullptr && l < lanes ? bias[o + l] : 0.f;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t k = 0; k < cols; ++k) {
          float* dst = image + ((tile.y + i) * g.w + tile.x + k) * channels + o;
          const float* src = y + (i * M + k) * kLanes;
          for (int64_t l = 0; l < lanes; ++l) dst[l] = src[l] + b[l];
        }
    }
  }
}

}  // namespace

template <int M>
void forward_tiles_channels_last(const Conv2dGeometry& g, int64_t in_channels, int64_t out_channels,
                                 const float* input, const float* u, const float* bias, float* out) {
  constexpr int64_t P = (M + 2) * (M + 2);
  const Tiling tiling(g, M);
  const int threads = omp_get_max_threads();
  // Per position: M[p] (rows x O) = V[p] (rows x C) . U[p]^T, u holding U[p]^T (C x O).
  auto multiply = [&](int64_t p, int64_t rows, const float* v, float* m) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, out_channels, in_channels, 1.f,
                v + p * rows * in_channels, in_channels, u + p * out_channels * in_channels, out_channels, 0.f,
                m + p * rows * out_channels, out_channels);
  };
  if (whole_batch(in_channels, out_channels, tiling.total, threads)) {
    const int64_t rows = tiling.total;
    Tensor workspace = empty({P * (in_channels + out_channels) * rows}, TensorOptions(kFloat32));
    float* v = workspace.data_ptr<float>();
    float* m = v + P * in_channels * rows;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t) transform_input<M>(g, in_channels, input, tiling, {t, t + 1, 0, rows}, v);
#pragma omp parallel for schedule(dynamic)
    for (int64_t p = 0; p < P; ++p) multiply(p, rows, v, m);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t)
      transform_output<M>(g, out_channels, m, tiling, {t, t + 1, 0, rows}, bias, out);
    return;
  }
  const int64_t block = block_tiles(M + 2, in_channels, out_channels, tiling.total, threads);
  const int64_t blocks = (tiling.total + block - 1) / block;
  const int64_t per_thread = P * (in_channels + out_channels) * block;
  const int team = static_cast<int>(std::min<int64_t>(threads, blocks));
  Tensor workspace = empty({team * per_thread}, TensorOptions(kFloat32));
  float* base = workspace.data_ptr<float>();
#pragma omp parallel num_threads(team)
  {
    float* v = base + omp_get_thread_num() * per_thread;
    float* m = v + P * in_channels * block;
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = b * block, last = std::min(first + block, tiling.total);
      const Rows r{first, last, first, last - first};
      transform_input<M>(g, in_channels, input, tiling, r, v);
      for (int64_t p = 0; p < P; ++p) multiply(p, r.rows, v, m);
      transform_output<M>(g, out_channels, m, tiling, r, bias, out);
    }
  }
}

template <int M>
void backward_weights_channels_last(const Conv2dGeometry& g, const float* input, const float* grad_out,
                                   float* grad_weight) {
  constexpr int64_t P = (M + 2) * (M + 2);
  const Tiling tiling(g, M);
  const int threads = omp_get_max_threads();
  // Per position: dU[p] (O x C) (+)= dM[p]^T (O x count) . V[p] (count x C), over rows
  // [first, first + count) of the `rows` that v and dm hold.
  auto multiply = [&](int64_t p, int64_t rows, int64_t first, int64_t count, const float* v, const float* dm,
                      float beta, float* du) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g.o, g.c, count, 1.f, dm + (p * rows + first) * g.o, g.o,
                v + (p * rows + first) * g.c, g.c, beta, du + p * g.o * g.c, g.c);
  };
  if (whole_batch(g.c, g.o, tiling.total, threads)) {  // no per-thread sums: each position's sgemm sums every tile
    const int64_t rows = tiling.total;
    Tensor workspace = empty({P * ((g.c + g.o) * rows + g.o * g.c)}, TensorOptions(kFloat32));
    float* v = workspace.data_ptr<float>();
    float* dm = v + P * g.c * rows;
    float* du = dm + P * g.o * rows;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t) {
      transform_input<M>(g, g.c, input, tiling, {t, t + 1, 0, rows}, v);
      transform_grad_out<M>(g, g.o, grad_out, tiling, {t, t + 1, 0, rows}, dm);
    }
#pragma omp parallel for schedule(dynamic)
    for (int64_t p = 0; p < P; ++p) multiply(p, rows, 0, rows, v, dm, 0.f, du);
    return inverse_transform_filters<M>(g, du, grad_weight);
  }
  Tensor workspace;  // See Note [Per-thread weight-gradient sums] (winograd_blocking.h)
  float* du = sum_weight_gradient_blocks(
      P, M + 2, g, tiling.total, threads, workspace,
      [&](int64_t first, int64_t count, float* v, float* dm, float* sums) {
        const Rows r{first, first + count, first, count};
        transform_input<M>(g, g.c, input, tiling, r, v);
        transform_grad_out<M>(g, g.o, grad_out, tiling, r, dm);
        for (int64_t p = 0; p < P; ++p)  // See Note [Weight-gradient sums in short runs]
          for_each_run(r.rows, [&](int64_t k, int64_t run) { multiply(p, r.rows, k, run, v, dm, 1.f, sums); });
      });
  inverse_transform_filters<M>(g, du, grad_weight);
}

void bias_gradient_channels_last(const Conv2dGeometry& g, const float* grad_out, float* grad_bias) {
  // Fixed chunks of pixels, summed in order: the bits do not depend on the thread count.
  constexpr int64_t kChunk = 256;
  const int64_t pixels = g.n * g.h * g.w, chunks = (pixels + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks * g.o, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    double* sum = partial.data() + k * g.o;
    for (int64_t px = k * kChunk; px < std::min(pixels, (k + 1) * kChunk); ++px) {
      const float* row = grad_out + px * g.o;
      for (int64_t o = 0; o < g.o; ++o) sum[o] += row[o];
    }
  }
  std::vector<double> total(g.o, 0.0);
  for (int64_t k = 0; k < chunks; ++k)
    for (int64_t o = 0; o < g.o; ++o) total[o] += partial[k * g.o + o];
  for (int64_t o = 0; o < g.o; ++o) grad_bias[o] = static_cast<float>(total[o]);
}

template void forward_tiles_channels_last<2>(const Conv2dGeometry&, int64_t, int64_t, const float*, const float*,
                                             const float*, float*);
template void forward_tiles_channels_last<4>(const Conv2dGeometry&, int64_t, int64_t, const float*, const float*,
                                             const float*, float*);
template void backward_weights_channels_last<2>(const Conv2dGeometry&, const float*, const float*, float*);
template void backward_weights_channels_last<4>(const Conv2dGeometry&, const float*, const float*, float*);

}  // namespace loom::cpu::winograd
