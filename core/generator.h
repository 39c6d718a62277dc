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

// The process-wide default generator, as torch.manual_seed seeds.
Generator& default_generator();
void manual_seed(uint64_t seed);

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
