// SampleRng: the random stream one sample's augmentation draws from.
//
// Note [Per-sample randomness]
// A random transform (RandomCrop, RandomHorizontalFlip, ...) applied to dataset index i
// in epoch e of a loader seeded with s draws from a stream keyed by (s, e, i) alone:
// draw k is random_bits(key(s, e, i), k) (see Note [Counter-based randomness] in
// core/generator.h). Nothing depends on which worker thread loads the sample, in which
// order workers finish, or how many workers there are, so a run with num_workers=0 and
// one with num_workers=8 see bit-identical batches, and a resumed run that calls
// loader.set_epoch(e) reproduces epoch e exactly.
//
// PyTorch differs here: each worker process seeds its own RNG (base_seed + worker_id),
// so augmentations change with num_workers. loom chooses the stronger guarantee because
// it makes every parallel mode's batches comparable with single-device ones.
//
// Corollary: if a sampler yields the same index twice in one epoch (DistributedSampler
// pads by repeating indices), both copies get the same augmentation.
#pragma once

#include <cstdint>

#include "core/generator.h"  // defines: random_bits, random_uniform

namespace loom::data {

// What, besides the index, decides a sample's random draws.
struct AugmentSeed {
  uint64_t seed = 0;
  int64_t epoch = 0;
};

class SampleRng {
 public:
  SampleRng(AugmentSeed augment, int64_t index)
      : augment_(augment),
        index_(index),
        key_(random_bits(random_bits(augment.seed ^ kDomain, static_cast<uint64_t>(augment.epoch)),
                         static_cast<uint64_t>(index))) {}

  // What the stream is keyed by: a transform whose rule spans epochs (alternating_flip)
  // draws from another epoch's stream of the same sample.
  AugmentSeed augment() const { return augment_; }
  int64_t index() const { return index_; }

  // 64 random bits; each call advances the stream by one.
  uint64_t bits() { return random_bits(key_, counter_++); }
  // Uniform in [0, 1), as torch.rand(1).
  double uniform() { return random_uniform(key_, counter_++); }
  // Uniform integer in [low, high), as torch.randint(low, high, (1,)). The modulo bias
  // is below 2^-50 for the ranges augmentation uses.
  int64_t randint(int64_t low, int64_t high) {
    return low + static_cast<int64_t>(bits() % static_cast<uint64_t>(high - low));
  }
  // How many draws this stream has made (tests use it to check both paths agree).
  uint64_t draws() const { return counter_; }

 private:
  // Separates augmentation streams from samplers' permutations under the same seed.
  static constexpr uint64_t kDomain = 0xA06E'D47A'5EED'0001ull;
  AugmentSeed augment_;
  int64_t index_;
  uint64_t key_;
  uint64_t counter_ = 0;
};

// Note [Alternating flip]
// Whether sample `index` is mirrored in `epoch` under airbench's alternating flip: a coin
// drawn once, from epoch 0's stream, inverted on odd epochs. Any two consecutive epochs
// then show every image once each way, where independent coins (RandomHorizontalFlip)
// show a quarter of the images the same way twice in a row; over ten epochs the net sees
// more distinct views, worth about as much as an extra epoch.
inline bool alternating_flip(uint64_t seed, int64_t epoch, int64_t index) {
  return (SampleRng({seed, 0}, index).uniform() < 0.5) != (epoch % 2 == 1);
}

}  // namespace loom::data
