// Internal to cuda/: the device copy of core/generator.h's counter-based generator
// (Note [Counter-based randomness]), shared by cuda/random.cu and cuda/dropout.cu.
// Keep identical to core/generator.h: see Note [Same numbers on every device] in
// cuda/random.cu, and the host-side check in tests/test_cuda.cpp.
#pragma once

#include <cstdint>

namespace loom::cuda {

// Copy of core/generator.h: random_bits.
__host__ __device__ inline uint64_t random_bits(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Copy of core/generator.h: random_uniform.
__host__ __device__ inline double random_uniform(uint64_t seed, uint64_t i) {
  return static_cast<double>(random_bits(seed, i) >> 11) * 0x1.0p-53;
}

}  // namespace loom::cuda
