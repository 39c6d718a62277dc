// CPU random kernels. See Note [Counter-based randomness]: element i of a draw is a
// pure function of (seed, first + i), so results do not depend on the thread count.
#include <cmath>
#include <numbers>

#include "core/kernels.h"

namespace loom::cpu {
namespace {

template <typename T, typename F>
void fill_random(Tensor& self, Generator& gen, F value_at) {
  LOOM_CHECK(self.is_contiguous(), "random fill expects a contiguous tensor");
  const int64_t n = self.numel();
  const uint64_t seed = gen.seed();
  const uint64_t first = gen.reserve(static_cast<uint64_t>(n));
  T* p = self.data_ptr<T>();
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(value_at(seed, first + static_cast<uint64_t>(i)));
}

void uniform_cpu(Tensor& self, double low, double high, Generator& gen) {
  dispatch_floating(self.dtype(), "rand/uniform_", [&]<typename T>() {
    fill_random<T>(self, gen, [=](uint64_t seed, uint64_t i) { return low + (high - low) * random_uniform(seed, i); });
  });
}

void normal_cpu(Tensor& self, double mean, double std, Generator& gen) {
  dispatch_floating(self.dtype(), "randn/normal_", [&]<typename T>() {
    // Box-Muller on two independent uniforms derived from the same counter.
    fill_random<T>(self, gen, [=](uint64_t seed, uint64_t i) {
      double u1 = 1.0 - random_uniform(seed, 2 * i);  // (0, 1]: log is finite
      double u2 = random_uniform(seed, 2 * i + 1);
      return mean + std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    });
  });
}

void randint_cpu(Tensor& self, int64_t low, int64_t high, Generator& gen) {
  const auto range = static_cast<uint64_t>(high - low);
  dispatch_all(self.dtype(), "randint", [&]<typename T>() {
    fill_random<T>(self, gen, [=](uint64_t seed, uint64_t i) {
      return low + static_cast<int64_t>(random_bits(seed, i) % range);
    });
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(uniform_kernel, DeviceType::CPU, uniform_cpu);
LOOM_REGISTER_KERNEL(normal_kernel, DeviceType::CPU, normal_cpu);
LOOM_REGISTER_KERNEL(randint_kernel, DeviceType::CPU, randint_cpu);

}  // namespace loom::cpu
