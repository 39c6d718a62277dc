// Generator: a seeded, counter-based random number source.
//
// Note [Counter-based randomness]
// Element i of a random tensor is a pure function of (seed, offset + i), where offset
// is the generator's position, advanced by numel after each draw. So a result does not
// depend on how many OpenMP threads fill the tensor, and a generator's whole state is
// two integers that checkpoints can save and restore exactly (train --resume).
#pragma once

#include <cstdint>
#include <mutex>

namespace loom {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed) {}

  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  uint64_t offset() const;  // thread-safe, as reserve()
  void set_state(uint64_t seed, uint64_t offset);
  // Reserves `count` consecutive counters and returns the first: the caller computes
  // element i from (seed(), first + i). Thread-safe.
  uint64_t reserve(uint64_t count);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide default generator, as torch.manual_seed seeds; on a thread inside a
// ReplayRandomScope, that scope's generator instead.
Generator& default_generator();
void manual_seed(uint64_t seed);

// Note [A recomputation draws its random numbers again]
// Activation checkpointing (nn/checkpoint.h) runs a segment's forward twice: once without
// a graph, and again in backward to build one. A Dropout in the segment must draw the
// same mask both times, or the gradients are of another forward. Counter-based
// randomness makes that cheap: the checkpoint notes the default generator's seed and
// offset before the first forward, and runs the recomputation inside a
// ReplayRandomScope at that position, which this thread's default_generator() then
// returns (other threads keep drawing from the real one, undisturbed). The checkpoint
// runs the first forward in such a scope too, counting what the segment draws, and then
// reserves that many numbers from the real generator: they are the ones the segment drew
// unless another thread drew in between (DP replica threads share the default
// generator), which is an error rather than two overlapping masks. The recomputation
// must draw exactly as many again. torch.utils.checkpoint's preserve_rng_state=True does
// the same by saving and restoring the generator's state.
class ReplayRandomScope {
 public:
  ReplayRandomScope(uint64_t seed, uint64_t offset);
  ~ReplayRandomScope();
  ReplayRandomScope(const ReplayRandomScope&) = delete;
  ReplayRandomScope& operator=(const ReplayRandomScope&) = delete;
  uint64_t offset() const { return generator_.offset(); }

 private:
  Generator generator_;
  Generator* outer_;
};

// The stateless mixing functions kernels use; see Note [Counter-based randomness].
// 64 random bits for counter `i` under `seed` (splitmix64 of a key).
inline uint64_t random_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in [0, 1) with 53 random bits.
inline double random_uniform(uint64_t seed, uint64_t i) {
  return static_cast<double>(random_bits(seed, i) >> 11) * 0x1.0p-53;
}

}  // namespace loom
