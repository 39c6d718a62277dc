// loom's Winograd convolution: the three passes over blocks of tiles, each a gather and
// transform, alpha^2 OpenBLAS sgemms and a transform and scatter (Note [Winograd tiles],
// core/cpu/winograd_transforms.h).
//
// Note [Winograd gradients]
// Both gradients are Winograd computations of their own, with the same matrices:
// - Input gradient. For stride 1 and padding 1 the input gradient is the convolution of
//   grad_out (padding 1) with the filters flipped in both spatial axes and with input and
//   output channels swapped, w'[c, o, i, j] = w[o, c, 2 - i, 2 - j]: the forward pass on
//   other operands.
// - Weight gradient. Y = A^T [U (.) V] A is linear in U = G g G^T, so differentiating the
//   forward's own formula gives dL/dU[p] = sum over tiles of (A dY A^T)[p] (.) V[p],
//   i.e. per position p the product dU[p] (O x C) = dM[p] (O x tiles) . V[p]^T, then
//   dL/dg = G^T dU G. Exact in exact arithmetic, since the forward formula is the
//   convolution exactly; the sum over tiles is a long GEMM reduction like the direct
//   algorithm's.
//
// Note [Winograd tile size]
// F(4x4) needs 36 products per 16 outputs, F(2x2) 16 per 4: F(4x4) does 2.25x less
// work per output, unless the image is so small that its 6x6 tiles are mostly padding.
// The tile side is the one with fewer products over the whole padded plane, 4 on ties:
// 4 for every ResNet18-CIFAR layer (32x32 down to 4x4, where one 6x6 tile covers the
// 4x4 output), 2 for 2x2 and 3x3 images.
#include "core/cpu/winograd_conv2d.h"

#include <cblas.h>  // defines: cblas_sgemm (single-threaded inside our parallel region: Note [BLAS threads])
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/winograd_blocking.h"    // defines: Tiling, block_tiles, whole_batch (Note [Winograd blocking])
#include "core/cpu/winograd_channels_last.h"  // defines: the NHWC passes
#include "core/cpu/winograd_transforms.h"  // defines: Matrices, transform_tile, transform_filters (Note [Winograd tiles])
#include "core/factory.h"                  // defines: empty (workspace from the caching allocator)

namespace loom::cpu {
namespace {

using winograd::kLanes;
using winograd::all_tiles;
using winograd::block_tiles;
using winograd::for_each_run;
using winograd::inverse_transform_filters;
using winograd::round_up;
using winograd::sum_weight_gradient_blocks;
using winograd::TileRef;
using winograd::Tiling;
using winograd::transform_filters;
using winograd::whole_batch;
using winograd::Matrices;
using winograd::transform_tile;
using winograd::Transposed;

// Gathers kLanes tiles of side `side` starting at output pixel (y + offset, x + offset) of
// one channel plane into d[i * side + k][lane], zero outside the image and for lanes past
// `count`.
template <int Side>
inline void gather_tiles(const float* plane, int64_t channel_stride, int64_t h, int64_t w, const TileRef* tiles,
                         int64_t count, int64_t offset, float* d) {
  for (int l = 0; l < kLanes; ++l) {
    if (l >= count) {
      for (int e = 0; e < Side * Side; ++e) d[e * kLanes + l] = 0.f;
      continue;
    }
    const TileRef& tile = tiles[l];
    const float* src = plane + tile.n * channel_stride;
    const int64_t y0 = tile.y + offset, x0 = tile.x + offset;
    if (y0 >= 0 && x0 >= 0 && y0 + Side <= h && x0 + Side <= w) {  // interior: no bounds checks
      for (int i = 0; i < Side; ++i)
        for (int k = 0; k < Side; ++k) d[(i * Side + k) * kLanes + l] = src[(y0 + i) * w + x0 + k];
    } else {
      for (int i = 0; i < Side; ++i)
        for (int k = 0; k < Side; ++k) {
          const int64_t y = y0 + i, x = x0 + k;
          d[(i * Side + k) * kLanes + l] = y >= 0 && y < h && x >= 0 && x < w ? src[y * w + x] : 0.f;
        }
    }
  }
}

// V[p][c][t] = (B^T d B)[p] for the block's input tiles (6x6 or 4x4, from one pixel up
// and left of the output tile: the padding).
template <int M>
void transform_input(const Conv2dGeometry& g, int64_t channels, const float* x, const TileRef* tiles, int64_t count,
                     int64_t padded, float* v, int64_t first = 0, int64_t last = -1) {
  constexpr int A = M + 2;
  alignas(32) float d[A * A * kLanes];
  alignas(32) float out[A * A * kLanes];
  const int64_t plane = g.h * g.w;
  for (int64_t c = first; c < (last < 0 ? channels : last); ++c)
    for (int64_t t = 0; t < padded; t += kLanes) {
      gather_tiles<A>(x + c * plane, channels * plane, g.h, g.w, tiles + t, count - t, -1, d);
      transform_tile<A, A>(Matrices<M>::BT, d, out);
      for (int p = 0; p < A * A; ++p) std::memcpy(v + (p * channels + c) * padded + t, out + p * kLanes, sizeof(float) * kLanes);
    }
}

// dM[p][o][t] = (A dY A^T)[p] for the block's m x m grad_out tiles (Note [Winograd gradients]).
template <int M>
void transform_grad_out(const Conv2dGeometry& g, int64_t channels, const float* grad_out, const TileRef* tiles,
                        int64_t count, int64_t padded, float* dm, int64_t first = 0, int64_t last = -1) {
  constexpr int A = M + 2;
  static constexpr Transposed<M, A> kA(Matrices<M>::AT);
  alignas(32) float d[M * M * kLanes];
  alignas(32) float out[A * A * kLanes];
  const int64_t plane = g.h * g.w;
  for (int64_t o = first; o < (last < 0 ? channels : last); ++o)
    for (int64_t t = 0; t < padded; t += kLanes) {
      gather_tiles<M>(grad_out + o * plane, channels * plane, g.h, g.w, tiles + t, count - t, 0, d);
      transform_tile<A, M>(kA.m, d, out);
      for (int p = 0; p < A * A; ++p) std::memcpy(dm + (p * channels + o) * padded + t, out + p * kLanes, sizeof(float) * kLanes);
    }
}

// out tile = A^T M A (+ bias), scattered into the NCHW output where it lies in the image.
template <int M>
void transform_output(const Conv2dGeometry& g, int64_t channels, const float* m, const TileRef* tiles, int64_t count,
                      int64_t padded, const float* bias, float* out, int64_t first = 0, int64_t last = -1) {
  constexpr int A = M + 2;
  alignas(32) float d[A * A * kLanes];
  alignas(32) float y[M * M * kLanes];
  const int64_t plane = g.h * g.w;
  for (int64_t o = first; o < (last < 0 ? channels : last); ++o) {
    const float b = bias != nullptr ? bias[o] : 0.f;
    for (int64_t t = 0; t < padded; t += kLanes) {
      for (int p = 0; p < A * A; ++p) std::memcpy(d + p * kLanes, m + (p * channels + o) * padded + t, sizeof(float) * kLanes);
      transform_tile<M, A>(Matrices<M>::AT, d, y);
      const int64_t lanes = std::min<int64_t>(kLanes, count - t);
      for (int l = 0; l < lanes; ++l) {
        const TileRef& tile = tiles[t + l];
        float* dst = out + (tile.n * channels + o) * plane;
        const int64_t rows = std::min<int64_t>(M, g.h - tile.y), cols = std::min<int64_t>(M, g.w - tile.x);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t k = 0; k < cols; ++k) dst[(tile.y + i) * g.w + tile.x + k] = y[(i * M + k) * kLanes + l] + b;
      }
    }
  }
}

// The forward pass, for the given filters U (in_channels -> out_channels): the
// convolution itself, or the input gradient (Note [Winograd gradients]).
template <int M>
void forward_tiles(const Conv2dGeometry& g, int64_t in_channels, int64_t out_channels, const float* input,
                   const float* u, const float* bias, float* out) {
  constexpr int64_t P = (M + 2) * (M + 2);
  const Tiling tiling(g, M);
  const int threads = omp_get_max_threads();
  if (whole_batch(in_channels, out_channels, tiling.total, threads)) {
    const std::vector<TileRef> tiles = all_tiles(tiling);
    const int64_t count = tiling.total, padded = round_up(count, kLanes);
    Tensor workspace = empty({P * (in_channels + out_channels) * padded}, TensorOptions(kFloat32));
    float* v = workspace.data_ptr<float>();
    float* m = v + P * in_channels * padded;
#pragma omp parallel for schedule(dynamic)
    for (int64_t c = 0; c < in_channels; ++c) transform_input<M>(g, in_channels, input, tiles.data(), count, padded, v, c, c + 1);
#pragma omp parallel for schedule(dynamic)
    for (int64_t p = 0; p < P; ++p)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out_channels, padded, in_channels, 1.f,
                  u + p * out_channels * in_channels, in_channels, v + p * in_channels * padded, padded, 0.f,
                  m + p * out_channels * padded, padded);
#pragma omp parallel for schedule(dynamic)
    for (int64_t o = 0; o < out_channels; ++o)
      transform_output<M>(g, out_channels, m, tiles.data(), count, padded, bias, out, o, o + 1);
    return;
  }
  const int64_t block = block_tiles(M + 2, in_channels, out_channels, tiling.total, threads);
  const int64_t blocks = (tiling.total + block - 1) / block;
  const int64_t per_thread = P * (in_channels + out_channels) * block;
  Tensor workspace = empty({std::min<int64_t>(threads, blocks) * per_thread}, TensorOptions(kFloat32));
  float* base = workspace.data_ptr<float>();
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(threads, blocks)))
  {
    float* v = base + omp_get_thread_num() * per_thread;
    float* m = v + P * in_channels * block;
    std::vector<TileRef> tiles(block);
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t first = b * block, count = std::min(block, tiling.total - first), padded = round_up(count, kLanes);
      for (int64_t t = 0; t < count; ++t) tiles[t] = tiling.at(first + t);
      transform_input<M>(g, in_channels, input, tiles.data(), count, padded, v);
      for (int64_t p = 0; p < P; ++p)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out_channels, padded, in_channels, 1.f,
                    u + p * out_channels * in_channels, in_channels, v + p * in_channels * padded, padded, 0.f,
                    m + p * out_channels * padded, padded);
      transform_output<M>(g, out_channels, m, tiles.data(), count, padded, bias, out);
    }
  }
}

template <int M>
void forward_with(const Conv2dGeometry& g, const float* input, const float* weight, const float* bias, float* out,
                  bool flip, bool channels_last) {
  constexpr int64_t P = (M + 2) * (M + 2);
  Tensor u = empty({P * g.o * g.c}, TensorOptions(kFloat32));
  transform_filters<M>(g, weight, flip, u.data_ptr<float>(), /*transposed=*/channels_last);
  const int64_t in_channels = flip ? g.o : g.c, out_channels = flip ? g.c : g.o;
  if (flip) bias = nullptr;
  if (channels_last) {
    winograd::forward_tiles_channels_last<M>(g, in_channels, out_channels, input, u.data_ptr<float>(), bias, out);
  } else {
    forward_tiles<M>(g, in_channels, out_channels, input, u.data_ptr<float>(), bias, out);
  }
}

template <int M>
void backward_weights_with(const Conv2dGeometry& g, const float* input, const float* grad_out, float* grad_weight) {
  constexpr int64_t P = (M + 2) * (M + 2);
  const Tiling tiling(g, M);
  const int threads = omp_get_max_threads();
  if (whole_batch(g.c, g.o, tiling.total, threads)) {  // no per-thread sums: each position's sgemm sums every tile
    const std::vector<TileRef> tiles = all_tiles(tiling);
    const int64_t count = tiling.total, padded = round_up(count, kLanes);
    Tensor workspace = empty({P * ((g.c + g.o) * padded + g.o * g.c)}, TensorOptions(kFloat32));
    float* v = workspace.data_ptr<float>();
    float* dm = v + P * g.c * padded;
    float* du = dm + P * g.o * padded;
#pragma omp parallel for schedule(dynamic)
    for (int64_t c = 0; c < g.c + g.o; ++c) {
      if (c < g.c) transform_input<M>(g, g.c, input, tiles.data(), count, padded, v, c, c + 1);
      else transform_grad_out<M>(g, g.o, grad_out, tiles.data(), count, padded, dm, c - g.c, c - g.c + 1);
    }
#pragma omp parallel for schedule(dynamic)
    for (int64_t p = 0; p < P; ++p)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.o, g.c, padded, 1.f, dm + p * g.o * padded, padded,
                  v + p * g.c * padded, padded, 0.f, du + p * g.o * g.c, g.c);
    return inverse_transform_filters<M>(g, du, grad_weight);
  }
  Tensor workspace;  // See Note [Per-thread weight-gradient sums] (winograd_blocking.h)
  float* du = sum_weight_gradient_blocks(
      P, M + 2, g, tiling.total, threads, workspace,
      [&](int64_t first, int64_t count, float* v, float* dm, float* sums) {
        const int64_t padded = round_up(count, kLanes);
        std::vector<TileRef> tiles(static_cast<size_t>(count));
        for (int64_t t = 0; t < count; ++t) tiles[t] = tiling.at(first + t);
        transform_input<M>(g, g.c, input, tiles.data(), count, padded, v);
        transform_grad_out<M>(g, g.o, grad_out, tiles.data(), count, padded, dm);
        for (int64_t p = 0; p < P; ++p)
          for_each_run(padded, [&](int64_t k, int64_t run) {  // See Note [Weight-gradient sums in short runs]
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.o, g.c, run, 1.f, dm + p * g.o * padded + k,
                        padded, v + p * g.c * padded + k, padded, 1.f, sums + p * g.o * g.c, g.c);
          });
      });
  inverse_transform_filters<M>(g, du, grad_weight);
}

}  // namespace

bool winograd_applies(const Conv2dGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.ph == 1 && g.pw == 1 && g.dh == 1 && g.dw == 1 &&
         g.groups == 1;
}

int winograd_tile(const Conv2dGeometry& g) {  // See Note [Winograd tile size]
  auto products = [&](int64_t m) { return ((g.h + m - 1) / m) * ((g.w + m - 1) / m) * (m + 2) * (m + 2); };
  return products(4) <= products(2) ? 4 : 2;
}

void winograd_forward(const Conv2dGeometry& g, const float* input, const float* weight, const float* bias,
                      float* out, bool channels_last) {
  if (winograd_tile(g) == 4) forward_with<4>(g, input, weight, bias, out, false, channels_last);
  else forward_with<2>(g, input, weight, bias, out, false, channels_last);
}

void winograd_backward_data(const Conv2dGeometry& g, const float* grad_out, const float* weight, float* grad_input,
                            bool channels_last) {
  if (winograd_tile(g) == 4) forward_with<4>(g, grad_out, weight, nullptr, grad_input, true, channels_last);
  else forward_with<2>(g, grad_out, weight, nullptr, grad_input, true, channels_last);
}

void winograd_backward_weights(const Conv2dGeometry& g, const float* input, const float* grad_out, float* grad_weight,
                               float* grad_bias, bool channels_last) {
  if (channels_last) {
    if (winograd_tile(g) == 4) winograd::backward_weights_channels_last<4>(g, input, grad_out, grad_weight);
    else winograd::backward_weights_channels_last<2>(g, input, grad_out, grad_weight);
    if (grad_bias != nullptr) winograd::bias_gradient_channels_last(g, grad_out, grad_bias);
    return;
  }
  if (winograd_tile(g) == 4) backward_weights_with<4>(g, input, grad_out, grad_weight);
  else backward_weights_with<2>(g, input, grad_out, grad_weight);
  if (grad_bias == nullptr) return;
  const int64_t plane = g.h * g.w;
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < g.o; ++o) {
    double sum = 0;
    for (int64_t n = 0; n < g.n; ++n) {
      const float* src = grad_out + (n * g.o + o) * plane;
      for (int64_t i = 0; i < plane; ++i) sum += src[i];
    }
    grad_bias[o] = static_cast<float>(sum);
  }
}

}  // namespace loom::cpu
