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
//
// bfloat16 runs natively, with PyTorch's semantics: the mask is a bfloat16 tensor, so
// its scale 1/(1 - p) is rounded to bfloat16 (exact for p = 0.5), and out = in * mask is
// computed in float and rounded once. Which units are dropped depends only on the
// counter, so a bfloat16 and a float32 run with one seed drop the same units.
#include "core/cpu/bf16_convert.h"  // defines: widen, narrow, narrow_into, dispatch_floating_16bit
#include "core/cpu/contiguous.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

void dropout_cpu(const Tensor& in_any, double p, Generator& gen, Tensor& out, Tensor& mask) {
  check_output_dense("dropout", out);
  check_output_dense("dropout", mask);
  LOOM_CHECK(p >= 0 && p < 1, "dropout kernel: expected p in [0, 1), got ", p);
  const Tensor in = contiguous_input(in_any);
  dispatch_floating_16bit(in.dtype(), "dropout", [&]<typename E>() {
    const int64_t n = in.numel();
    const uint64_t seed = gen.seed();
    const uint64_t first = gen.reserve(static_cast<uint64_t>(n));
    const double keep = 1.0 - p;
    const E scale = narrow<E>(1.0 / keep);
    const E* x = in.data_ptr<E>();
    E* y = out.data_ptr<E>();
    E* m = mask.data_ptr<E>();
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t i = 0; i < n; ++i) {
      const E mi = random_uniform(seed, first + static_cast<uint64_t>(i)) < keep ? scale : E();
      m[i] = mi;
      narrow_into(y[i], widen(x[i]) * widen(mi));
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(dropout_kernel, DeviceType::CPU, dropout_cpu);

}  // namespace loom::cpu
