// bench_ops: how fast loom's heaviest CPU op is, measured against the machine's own
// matrix-multiply rate.
//
//   build/bench/bench_ops                      # sgemm, then conv2d fwd+bwd per ResNet18 shape
//   build/bench/bench_ops --torch              # ... and the same convolutions in PyTorch
//   build/bench/bench_ops --torch-keep-memory  # ... with glibc told to keep freed memory
//   build/bench/bench_ops --layouts            # conv2d in every layout (Note [Conv2d memory layout])
//   build/bench/bench_ops --dtype=bf16         # conv2d in bfloat16 (Note [bfloat16 on the CPU])
//   build/bench/bench_ops --bf16-vs-float32    # both, interleaved, and their speed ratio
//   OMP_NUM_THREADS=1 build/bench/bench_ops --runs=3 --batch=32
//
// sgemm (2048^3, OpenBLAS) is the yardstick: a convolution is a matrix multiply in
// disguise, so conv GFLOP/s / sgemm GFLOP/s says how much of the machine it uses.
// Convolution FLOPs are counted as three direct convolutions (forward, input gradient,
// weight gradient), each 2 * N * Cout * Hout * Wout * Cin * kH * kW.
// Every number is the median of --runs timed runs after one warm-up run.
//
// Note [PyTorch and page faults]
// PyTorch's CPU allocator frees every tensor to glibc, which unmaps blocks this large, so
// each PyTorch convolution page-faults its output and oneDNN's reorder buffers back in.
// loom's caching allocator (Note [Caching allocator]) does not. On a busy VM that alone
// made PyTorch 2-3x slower on the 32x32 shape; --torch-keep-memory raises glibc's mmap and
// trim thresholds for the PyTorch run, which compares the convolutions themselves.
#include <cblas.h>  // defines: cblas_sgemm, the yardstick
#include <omp.h>    // defines: omp_get_max_threads, the thread count reported

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autograd/ops.h"  // defines: loom::randn, the kernels' dispatch stubs

namespace {

using namespace loom;

struct Options {
  int runs = 5;
  int64_t batch = 128;
  bool torch = false;
  bool torch_keep_memory = false;  // Note [PyTorch and page faults]
  std::string python = "python3";
  bool layouts = false;
  DType dtype = kFloat32;     // --dtype=float32|bf16
  bool bf16_vs_float32 = false;
};

Options parse(int argc, char** argv) {
  Options options;
  if (const char* python = std::getenv("LOOM_PYTHON")) options.python = python;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--runs=", 0) == 0) options.runs = std::max(1, std::atoi(arg.c_str() + 7));
    else if (arg.rfind("--batch=", 0) == 0) options.batch = std::max(1, std::atoi(arg.c_str() + 8));
    else if (arg == "--torch") options.torch = true;
    else if (arg.rfind("--torch=", 0) == 0) options.torch = true, options.python = arg.substr(8);
    else if (arg == "--torch-keep-memory") options.torch = options.torch_keep_memory = true;
    else if (arg == "--layouts") options.layouts = true;
    else if (arg == "--dtype=float32") options.dtype = kFloat32;
    else if (arg == "--dtype=bf16") options.dtype = kBFloat16;
    else if (arg == "--bf16-vs-float32") options.bf16_vs_float32 = true;
    else {
      std::fprintf(stderr,
                   "bench_ops: unknown argument '%s'\n"
                   "usage: bench_ops [--runs=N] [--batch=N] [--torch[=PYTHON]] [--torch-keep-memory] [--layouts]\n"
                   "                 [--dtype=float32|bf16] [--bf16-vs-float32]\n"
                   "  --torch runs bench/bench_conv_torch.py with PYTHON (default $LOOM_PYTHON or python3)\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  return options;
}

// Median seconds of `runs` calls of f, after one warm-up call (which builds oneDNN plans
// and fills loom's caching allocator).
double median_seconds(int runs, const std::function<void()>& f) {
  f();
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    auto start = std::chrono::steady_clock::now();
    f();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double sgemm_gflops(int runs) {
  const int n = 2048;
  Tensor a = randn({n, n}), b = randn({n, n}), c = empty({n, n});
  double seconds = median_seconds(runs, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data_ptr<float>(), n,
                b.data_ptr<float>(), n, 0.0f, c.data_ptr<float>(), n);
  });
  return 2.0 * n * n * n / seconds / 1e9;
}

struct ConvShape {
  int64_t channels, size;  // in = out channels, square images, 3x3 kernel, stride 1, pad 1
};
const std::vector<ConvShape> kResNetShapes = {{64, 32}, {128, 16}, {256, 8}, {512, 4}};

struct ConvTiming {
  double forward_ms, backward_ms, gflops;
};

// Times the kernels directly (no autograd) so the number is the convolution alone. In
// bfloat16 the weight gradient is float32, as autocast asks for it (Note [Autocast conv2d
// weight gradients]).
ConvTiming time_conv(const ConvShape& s, int64_t batch, int runs, DType dtype = kFloat32) {
  Tensor x = randn({batch, s.channels, s.size, s.size}).to(dtype);
  Tensor w = randn({s.channels, s.channels, 3, 3}).to(dtype);
  Tensor y = empty({batch, s.channels, s.size, s.size}, TensorOptions(dtype));
  Tensor grad_y = randn(y.shape()).to(dtype);
  Tensor grad_x = empty_like(x), grad_w = empty(w.shape(), TensorOptions(kFloat32)), no_bias;
  Conv2dParams params;
  params.padding[0] = params.padding[1] = 1;
  auto forward = [&] { conv2d_forward_kernel(x.device())(x, w, no_bias, params, y); };
  auto backward = [&] { conv2d_backward_kernel(x.device())(grad_y, x, w, params, grad_x, grad_w, no_bias); };
  double fwd = median_seconds(runs, forward), bwd = median_seconds(runs, backward);
  double flops = 3.0 * 2.0 * batch * s.channels * s.size * s.size * s.channels * 9;
  return {fwd * 1e3, bwd * 1e3, flops / (fwd + bwd) / 1e9};
}

// PyTorch's (forward ms, backward ms) for one shape from bench_conv_torch.py, run right
// before loom's own measurement of that shape so both see the same machine load.
std::optional<std::pair<double, double>> run_torch(const Options& options, const ConvShape& s) {
  std::string env = options.torch_keep_memory
                        ? "MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 "
                        : "";
  std::string command = env + options.python + " " LOOM_BENCH_DIR "/bench_conv_torch.py --batch=" +
                        std::to_string(options.batch) + " --runs=" + std::to_string(options.runs) +
                        " --threads=" + std::to_string(omp_get_max_threads()) +
                        " --channels=" + std::to_string(s.channels) + " --size=" + std::to_string(s.size);
  std::optional<std::pair<double, double>> result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    long long channels = 0, size = 0;
    double fwd = 0, bwd = 0;
    if (std::sscanf(line, "conv %lld %lld %lf %lf", &channels, &size, &fwd, &bwd) == 4) result = {fwd, bwd};
    else std::fputs(line, stderr);  // the script's own messages (e.g. torch missing)
  }
  if (pclose(pipe) != 0 || !result)
    std::fprintf(stderr, "bench_ops: '%s' failed; is PyTorch installed for that python? (--torch=/usr/bin/python3)\n",
                 command.c_str());
  return result;
}

void conv_table(const Options& options, double sgemm) {
  std::printf("\nconv2d 3x3 stride 1 pad 1, batch %lld, fwd + bwd-data + bwd-weights:\n",
              static_cast<long long>(options.batch));
  std::printf("%-18s %9s %9s %9s %9s", "shape (C, HxW)", "fwd ms", "bwd ms", "GFLOP/s", "vs sgemm");
  if (options.torch) std::printf(" %12s %12s %11s", "torch fwd ms", "torch bwd ms", "loom/torch");
  std::printf("\n");
  for (const ConvShape& s : kResNetShapes) {
    std::optional<std::pair<double, double>> torch;
    if (options.torch) torch = run_torch(options, s);
    ConvTiming t = time_conv(s, options.batch, options.runs, options.dtype);
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lld, %lldx%lld", static_cast<long long>(s.channels),
                  static_cast<long long>(s.size), static_cast<long long>(s.size));
    std::printf("%-18s %9.1f %9.1f %9.1f %8.0f%%", shape, t.forward_ms, t.backward_ms, t.gflops,
                100.0 * t.gflops / sgemm);
    if (torch) {
      // Speed ratio: > 1 means loom is faster.
      double ratio = (torch->first + torch->second) / (t.forward_ms + t.backward_ms);
      std::printf(" %12.1f %12.1f %10.2fx", torch->first, torch->second, ratio);
    }
    std::printf("\n");
  }
}

// float32 and bfloat16 fwd+bwd per shape, alternating `repeats` times so that both see
// the same load from the rest of the machine; the ratio is the median of the repeats'.
void bf16_table(const Options& options) {
  const int repeats = 3;
  std::printf("\nconv2d 3x3 stride 1 pad 1, batch %lld, fwd + bwd, float32 vs bfloat16 (%d interleaved repeats):\n",
              static_cast<long long>(options.batch), repeats);
  std::printf("%-18s %13s %13s %13s %13s %11s\n", "shape (C, HxW)", "f32 fwd ms", "f32 bwd ms", "bf16 fwd ms",
              "bf16 bwd ms", "f32/bf16");
  for (const ConvShape& s : kResNetShapes) {
    std::vector<ConvTiming> f32, bf16;
    std::vector<double> ratios;
    for (int i = 0; i < repeats; ++i) {
      f32.push_back(time_conv(s, options.batch, options.runs, kFloat32));
      bf16.push_back(time_conv(s, options.batch, options.runs, kBFloat16));
      ratios.push_back((f32.back().forward_ms + f32.back().backward_ms) /
                       (bf16.back().forward_ms + bf16.back().backward_ms));
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    auto field = [&](const std::vector<ConvTiming>& ts, double ConvTiming::*member) {
      std::vector<double> v;
      for (const ConvTiming& t : ts) v.push_back(t.*member);
      return median(v);
    };
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lld, %lldx%lld", static_cast<long long>(s.channels),
                  static_cast<long long>(s.size), static_cast<long long>(s.size));
    std::printf("%-18s %13.1f %13.1f %13.1f %13.1f %10.2fx\n", shape, field(f32, &ConvTiming::forward_ms),
                field(f32, &ConvTiming::backward_ms), field(bf16, &ConvTiming::forward_ms),
                field(bf16, &ConvTiming::backward_ms), median(ratios));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);
  std::printf("bench_ops: %d threads (OMP_NUM_THREADS), median of %d runs after a warm-up\n", omp_get_max_threads(),
              options.runs);
  double sgemm = sgemm_gflops(options.runs);
  std::printf("sgemm 2048x2048x2048 (OpenBLAS): %.1f GFLOP/s\n", sgemm);
  if (options.bf16_vs_float32) {
    bf16_table(options);
    return 0;
  }
  if (!options.layouts) {
    conv_table(options, sgemm);
    return 0;
  }
  for (const char* layout : {"blocked", "nchw", "nhwc"}) {
    setenv("LOOM_CONV2D_LAYOUT", layout, 1);  // read per call; see Note [Conv2d memory layout]
    std::printf("\n== LOOM_CONV2D_LAYOUT=%s", layout);
    conv_table(options, sgemm);
  }
  return 0;
}
