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

#include "core/cpu/conv2d_reference.h"     // defines: Conv2dGeometry
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

inline std::vector<TileRef> all_tiles(const Tiling& tiling) {
  std::vector<TileRef> tiles(tiling.total);
  for (int64_t t = 0; t < tiling.total; ++t) tiles[t] = tiling.at(t);
  return tiles;
}

}  // namespace loom::cpu::winograd
