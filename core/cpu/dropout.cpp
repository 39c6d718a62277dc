// CPU dropout: mask = bernoulli(1 - p) / (1 - p), out = in * mask.
//
// Element i keeps its value when uniform(seed, first + i) < 1 - p, with `first` the
// generator's reserved counter (Note [Counter-based randomness], core/generator.h): the
// mask depends only on the seed and the generator's position, never on the thread
// count, so a seeded run drops the same units on any machine.
//
// The mask is kept (by the autograd op) rather than regenerated in backward: it is
// what dropout's gradient multiplies by, and saving it keeps backward independent of
// the generator's later state.
#include "core/cpu/contiguous.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

void dropout_cpu(const Tensor& in_any, double p, Generator& gen, Tensor& out, Tensor& mask) {
  check_output_dense("dropout", out);
  check_output_dense("dropout", mask);
  LOOM_CHECK(p >= 0 && p < 1, "dropout kernel: expected p in [0, 1), got ", p);
  const Tensor in = contiguous_input(in_any);
  dispatch_floating(in.dtype(), "dropout", [&]<typename T>() {
    const int64_t n = in.numel();
    const uint64_t seed = gen.seed();
    const uint64_t first = gen.reserve(static_cast<uint64_t>(n));
    const double keep = 1.0 - p;
    const T scale = static_cast<T>(1.0 / keep);
    const T* x = in.data_ptr<T>();
    T* y = out.data_ptr<T>();
    T* m = mask.data_ptr<T>();
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) {
      const T mi = random_uniform(seed, first + static_cast<uint64_t>(i)) < keep ? scale : T(0);
      m[i] = mi;
      y[i] = x[i] * mi;
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(dropout_kernel, DeviceType::CPU, dropout_cpu);

}  // namespace loom::cpu
