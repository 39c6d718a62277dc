// winograd_step: loom's side of bench/winograd_error_torch.py, which compares one SGD step
// of conv -> relu -> conv in float32 (loom's Winograd, loom's direct algorithm, PyTorch)
// against the same step in float64.
//
//   OMP_NUM_THREADS=3 build/bench/winograd_step --out /tmp/winograd/loom.safetensors
//
// Draws the inputs of tests/test_winograd.cpp's "one SGD step" case from the same seeds
// (x, w1, w2, target in float64), takes the step -lr * gradient of
// mean((conv(relu(conv(x, w1)), w2) - target)^2) (padding 1, no bias) in float64 with the
// direct algorithm, and in float32 with the direct algorithm and with loom's Winograd, each
// with NCHW and with channels-last activations, and writes the inputs and every update.
// LOOM_CPU_ISA=avx2 (Note [CPU ISA switch]) is set, as in the test, so that loom runs its
// own Winograd on AVX-512 machines too; the thread count is OpenMP's (OMP_NUM_THREADS).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "autograd/ops.h"    // defines: conv2d, relu, randn
#include "core/generator.h"  // defines: Generator (the test's seeds)
#include "nn/safetensors.h"  // defines: safetensors::save_file

using namespace loom;

namespace {

// tests/gradcheck.h's leaf: float64 values from a seeded normal distribution, times scale.
Tensor draw(const Shape& shape, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  return randn(shape, TensorOptions(kFloat64), &gen) * scale;
}

struct Problem {
  Tensor x, w1, w2, target;
  double lr;
};

// The update of w1 and w2, computed in `dtype` by `algo` (LOOM_CONV2D_ALGO) with the
// activations in `format`.
std::pair<Tensor, Tensor> step(const Problem& p, DType dtype, const char* algo, MemoryFormat format) {
  setenv("LOOM_CONV2D_ALGO", algo, 1);
  Tensor a = p.w1.detach().to(dtype).requires_grad_(true), b = p.w2.detach().to(dtype).requires_grad_(true);
  Tensor input = p.x.to(dtype).contiguous(format);
  Tensor out = conv2d(relu(conv2d(input, a, Tensor(), {1}, {1})), b, Tensor(), {1}, {1});
  Tensor diff = out - p.target.to(dtype);
  (diff * diff).mean().backward();
  unsetenv("LOOM_CONV2D_ALGO");
  return {a.grad() * -p.lr, b.grad() * -p.lr};
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "/tmp/winograd/loom.safetensors";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--out") out = value;
    else {
      std::fprintf(stderr, "winograd_step: unknown flag %s (expected --out PATH; threads come from OMP_NUM_THREADS)\n",
                   flag.c_str());
      return 2;
    }
  }
  setenv("LOOM_CPU_ISA", "avx2", 1);
  const double fan_in = 32 * 3 * 3;
  const Problem p{draw({8, 32, 16, 16}, 21), draw({32, 32, 3, 3}, 22, 1.0 / std::sqrt(fan_in)),
                  draw({32, 32, 3, 3}, 23, 1.0 / std::sqrt(fan_in)), draw({8, 32, 16, 16}, 24), 0.1};
  OrderedDict<Tensor> result;
  result.insert("x", p.x);
  result.insert("w1", p.w1);
  result.insert("w2", p.w2);
  result.insert("target", p.target);
  struct Run {
    const char* name;
    DType dtype;
    const char* algo;
    MemoryFormat format;
  };
  const Run runs[] = {{"float64", kFloat64, "direct", MemoryFormat::Contiguous},
                      {"direct", kFloat32, "direct", MemoryFormat::Contiguous},
                      {"direct_channels_last", kFloat32, "direct", MemoryFormat::ChannelsLast},
                      {"winograd", kFloat32, "winograd", MemoryFormat::Contiguous},
                      {"winograd_channels_last", kFloat32, "winograd", MemoryFormat::ChannelsLast}};
  for (const Run& r : runs) {
    const auto [u1, u2] = step(p, r.dtype, r.algo, r.format);
    result.insert(std::string(r.name) + ".w1", u1.contiguous());
    result.insert(std::string(r.name) + ".w2", u2.contiguous());
  }
  safetensors::save_file(result, out);
  return 0;
}
