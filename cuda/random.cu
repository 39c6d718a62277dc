// CUDA random kernels: uniform_, normal_, randint, with the counter-based scheme of
// core/generator.h (Note [Counter-based randomness]).
//
// Note [Same numbers on every device]
// Element i of a draw is f(seed, first + i) on the CPU and on the GPU alike, so
// manual_seed(s); randn({n}, cuda) equals randn({n}, cpu).to(cuda), and a run does not
// change its numbers when it moves to a GPU. For that:
// - random_bits / random_uniform (cuda/random_bits.cuh) are a *copy* of
//   core/generator.h's (core/ cannot mark its functions __device__ without a CUDA
//   header). tests/test_cuda.cpp checks the copy against the original on the host, on
//   every build, GPU or not; change both together. Dropout (cuda/dropout.cu) draws
//   from the same copy.
// - The affine maps use __dmul_rn / __dadd_rn: nvcc would otherwise contract
//   a + b * c into one fused multiply-add, which rounds differently from the CPU
//   (core/cpu/random.cpp is compiled without contraction: Note [No fused multiply-adds
//   where the GPU must agree] in meson.build).
// - uniform and randint are then bit-identical to the CPU. normal also calls log, sqrt
//   and cos in double: sqrt is exact in both, and CUDA's log/cos are within 1 ulp of
//   glibc's, so after rounding to float the values agree to ~1e-15 relative (float) and
//   bit for bit almost always.
#include <numbers>

#include "core/kernels.h"
#include "cuda/loops.cuh"   // defines: dispatch_types, grid_size, kBlockSize
#include "cuda/random.h"
#include "cuda/random_bits.cuh"  // defines: random_bits, random_uniform (device copies)

namespace loom::cuda {
namespace {

struct UniformFn {
  double low, scale;  // scale = high - low, computed on the host as the CPU does
  __device__ double operator()(uint64_t seed, uint64_t i) const {
    return __dadd_rn(low, __dmul_rn(scale, random_uniform(seed, i)));
  }
};

struct NormalFn {
  double mean, std;
  __device__ double operator()(uint64_t seed, uint64_t i) const {  // Box-Muller, as core/cpu/random.cpp
    const double u1 = __dsub_rn(1.0, random_uniform(seed, 2 * i));
    const double u2 = random_uniform(seed, 2 * i + 1);
    const double radius = sqrt(__dmul_rn(-2.0, log(u1)));
    const double angle = cos(__dmul_rn(2.0 * std::numbers::pi, u2));
    return __dadd_rn(mean, __dmul_rn(__dmul_rn(std, radius), angle));
  }
};

struct RandintFn {
  int64_t low;
  uint64_t range;
  __device__ int64_t operator()(uint64_t seed, uint64_t i) const {
    return low + static_cast<int64_t>(random_bits(seed, i) % range);
  }
};

template <typename T, typename F>
__global__ void __launch_bounds__(kBlockSize) random_kernel(T* out, int64_t n, uint64_t seed, uint64_t first, F value_at) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = static_cast<T>(value_at(seed, first + static_cast<uint64_t>(i)));
}

template <typename T, typename F>
void fill_random(Tensor& self, Generator& gen, F value_at, const char* op) {
  LOOM_CHECK(self.is_contiguous(), op, ": random fill expects a contiguous tensor");
  const int64_t n = self.numel();
  if (n == 0) return;
  const int device = self.device().index;
  DeviceGuard guard(device);
  const uint64_t seed = gen.seed();
  const uint64_t first = gen.reserve(static_cast<uint64_t>(n));
  random_kernel<T><<<grid_size(n, device), kBlockSize, 0, current_stream(device).handle>>>(
      static_cast<T*>(self.raw_data()), n, seed, first, value_at);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

void uniform_cuda(Tensor& self, double low, double high, Generator& gen) {
  dispatch_types(FloatTypes{}, self.dtype(), "rand/uniform_", [&]<typename T>() {
    fill_random<T>(self, gen, UniformFn{low, high - low}, "rand/uniform_");
  });
}

void normal_cuda(Tensor& self, double mean, double std, Generator& gen) {
  dispatch_types(FloatTypes{}, self.dtype(), "randn/normal_", [&]<typename T>() {
    fill_random<T>(self, gen, NormalFn{mean, std}, "randn/normal_");
  });
}

void randint_cuda(Tensor& self, int64_t low, int64_t high, Generator& gen) {
  const RandintFn fn{low, static_cast<uint64_t>(high - low)};
  dispatch_types(TypeList<int64_t, int32_t, float, double>{}, self.dtype(), "randint", [&]<typename T>() {
    fill_random<T>(self, gen, fn, "randint");
  });
}

}  // namespace

uint64_t device_random_bits_on_host(uint64_t seed, uint64_t i) { return random_bits(seed, i); }
double device_random_uniform_on_host(uint64_t seed, uint64_t i) { return random_uniform(seed, i); }

LOOM_REGISTER_KERNEL(uniform_kernel, DeviceType::CUDA, uniform_cuda);
LOOM_REGISTER_KERNEL(normal_kernel, DeviceType::CUDA, normal_cuda);
LOOM_REGISTER_KERNEL(randint_kernel, DeviceType::CUDA, randint_cuda);

}  // namespace loom::cuda
