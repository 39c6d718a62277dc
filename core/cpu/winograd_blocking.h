// How loom's Winograd passes cut a batch into tiles and the tiles into blocks, in either
// activation layout (core/cpu/winograd_conv2d.cpp for NCHW, winograd_channels_last.cpp
// for NHWC).
//
// Note [Winograd blocking]
// The tiles are processed in blocks: one thread transforms a block's input tiles into
// V (alpha^2 x C x block floats), multiplies, and transforms the products M
// (alpha^2 x O x block) back, while both are still in its L2 cache. kL2Bytes is a
// conservative per-core L2 (AMD Zen 2-4: 512 KiB-1 MiB, Intel since Skylake-SP: 1-2 MiB);
// the block is also kept at least 16 tiles, so that each sgemm has some width, and small
// enough that every thread gets a block. That suits many tiles and few channels (32x32
// images, 64 channels). With few tiles and many channels (4x4 images, 512 channels) the
// filters U (alpha^2 x O x C) outweigh a block's V and M, and the weight gradient's
// per-thread sums of dU would be larger than all of V and dM: there the whole batch is
// one block, transformed with the threads splitting the channels (NCHW) or the tiles
// (NHWC), and the alpha^2 sgemms are split among the threads (whole_batch below).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <omp.h>  // defines: omp_get_thread_num (sum_weight_gradient_blocks' team)

#include "core/cpu/conv2d_reference.h"     // defines: Conv2dGeometry
#include "core/factory.h"                  // defines: empty (the team's workspace)
#include "core/cpu/winograd_transforms.h"  // defines: kLanes

namespace loom::cpu::winograd {

constexpr int64_t kL2Bytes = 512 * 1024;  // See Note [Winograd blocking]
constexpr int64_t kMinBlock = 16;

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Where a tile's top-left output pixel lies.
struct TileRef {
  int64_t n, y, x;
};

// The tiles of a batch of H x W images cut into m x m tiles, numbered image by image,
// row by row.
struct Tiling {
  int64_t m, rows, cols, total;
  Tiling(const Conv2dGeometry& g, int64_t m_)
      : m(m_), rows((g.h + m_ - 1) / m_), cols((g.w + m_ - 1) / m_), total(g.n * rows * cols) {}
  TileRef at(int64_t t) const {
    const int64_t per_image = rows * cols, r = t % per_image;
    return {t / per_image, r / cols * m, r % cols * m};
  }
};

// See Note [Winograd blocking]: tiles per block, a multiple of kLanes.
inline int64_t block_tiles(int64_t alpha, int64_t in_channels, int64_t out_channels, int64_t total, int threads) {
  const int64_t fit = kL2Bytes / (alpha * alpha * (in_channels + out_channels) * int64_t{sizeof(float)});
  const int64_t share = round_up((total + threads - 1) / threads, kLanes);
  return std::max<int64_t>(kLanes, std::min(round_up(std::max(fit, kMinBlock), kLanes), share));
}

// See Note [Winograd blocking]: whether the whole batch is one block, with the transforms
// split among the threads and the sgemms split over positions.
inline bool whole_batch(int64_t in_channels, int64_t out_channels, int64_t tiles, int threads) {
  return threads > 1 && (in_channels + out_channels) * tiles <= threads * in_channels * out_channels;
}

// Note [Weight-gradient sums in short runs]
// Each entry of dU[p] sums one product per tile, and the inverse transform G^T dU G
// cancels most of what those sums hold, so their rounding, more than the tile
// transforms', decides the weight gradient's error. An sgemm adds its K products one
// after another (OpenBLAS keeps one accumulator per entry), and a block's 48-56 tiles in
// one sgemm left tests/test_winograd.cpp's SGD step 1.04e-6 from float64 (w1, three
// threads): 2.7x PyTorch float32's. So the blocked passes add a block's products
// kSumRun tiles per sgemm (beta 1): sums of 16 terms, then one addition per run. That
// alone took the step's error to 9.1e-7, as Note [Filter transforms in float64] alone
// did; both together to 7.8e-7 (bench/winograd_error_torch.py). Blocks of many channels
// are kMinBlock = kSumRun tiles already, and where blocks are longer dU is small enough
// to stay in cache, so the extra sgemm calls cost about 5% of the weight gradient on the
// smallest shapes and nothing measurable on ResNet18's. whole_batch keeps one sgemm over
// every tile: there dU[p] is O x C of many channels, and reading it again per run would
// cost more than the sgemm.
constexpr int64_t kSumRun = 16;

// Calls sum(first, count) for the runs of at most kSumRun rows that make up `rows`, in
// order: the weight gradient's sgemms each add one run's products into dU (beta 1).
template <typename Sum>
inline void for_each_run(int64_t rows, const Sum& sum) {
  for (int64_t first = 0; first < rows; first += kSumRun) sum(first, std::min(kSumRun, rows - first));
}

// Note [Per-thread weight-gradient sums]
// The weight gradient sums the products of every tile. Past whole_batch, each of a team
// of threads sums its blocks of tiles into a dU of its own (a static schedule: the same
// blocks, so the same rounding, from run to run), and the team's sums are added in thread
// order after. Each thread's workspace holds its V (positions x C x block), dM
// (positions x O x block) and dU (positions x O x C). add_block(first, count, v, dm, du)
// transforms tiles [first, first + count) into v and dm and adds their products into du,
// in the layout it computes in (NCHW or channels-last). Returns the summed dU, which
// lives in `workspace`.
template <typename AddBlock>
float* sum_weight_gradient_blocks(int64_t positions, int64_t alpha, const Conv2dGeometry& g, int64_t total,
                                  int threads, Tensor& workspace, const AddBlock& add_block) {
  const int64_t block = block_tiles(alpha, g.c, g.o, total, threads);
  const int64_t blocks = (total + block - 1) / block;
  const int team = static_cast<int>(std::min<int64_t>(threads, blocks));
  const int64_t per_thread = positions * (g.c + g.o) * block, filters = positions * g.o * g.c;
  workspace = empty({team * (per_thread + filters)}, TensorOptions(kFloat32));
  float* base = workspace.data_ptr<float>();
#pragma omp parallel num_threads(team)
  {
    float* v = base + omp_get_thread_num() * (per_thread + filters);
    float* dm = v + positions * g.c * block;
    float* du = dm + positions * g.o * block;
    std::fill(du, du + filters, 0.f);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) add_block(b * block, std::min(block, total - b * block), v, dm, du);
  }
  float* du = base + per_thread;
  for (int t = 1; t < team; ++t) {
    const float* other = base + t * (per_thread + filters) + per_thread;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < filters; ++i) du[i] += other[i];
  }
  return du;
}

inline std::vector<TileRef> all_tiles(const Tiling& tiling) {
  std::vector<TileRef> tiles(tiling.total);
  for (int64_t t = 0; t < tiling.total; ++t) tiles[t] = tiling.at(t);
  return tiles;
}

}  // namespace loom::cpu::winograd
