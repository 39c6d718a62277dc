// Internal to cuda/ and its tests: the device copy of core/generator.h's mixing
// functions, callable from the host so a test can check, without a GPU, that the copy
// has not drifted from the original. See Note [Same numbers on every device] in
// cuda/random.cu.
#pragma once

#include <cstdint>

namespace loom::cuda {

// cuda/random.cu's random_bits / random_uniform, evaluated on the host.
uint64_t device_random_bits_on_host(uint64_t seed, uint64_t i);
double device_random_uniform_on_host(uint64_t seed, uint64_t i);

}  // namespace loom::cuda
