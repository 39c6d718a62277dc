// bench_vit: ViT-tiny's training throughput and its attention alone, loom's side of
// bench/bench_vit_torch.py (which runs this and the same steps in PyTorch, and prints both).
//
//   build/bench/bench_vit --batch 128 --steps 5 --threads 2
//
// Prints two lines of key=value: "sdpa ms=..." (scaled_dot_product_attention forward and
// backward at ViT-tiny's shape, [batch, 3 heads, 65 tokens, 64]) and "train img_s=... ms=..."
// (forward, cross-entropy, backward, clip_grad_norm_(1.0), AdamW step on random images),
// each the median of --steps timed steps after two warm-up steps, and the peak of loom's
// allocator ("peak_mib").
#include <omp.h>  // defines: omp_set_num_threads

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "autograd/ops.h"           // defines: scaled_dot_product_attention, cross_entropy, randn
#include "core/allocator.h"         // defines: memory_stats
#include "nn/optim/adamw.h"         // defines: AdamW, param_groups_weight_decay
#include "nn/optim/clip_grad.h"     // defines: clip_grad_norm_
#include "nn/vision_transformer.h"  // defines: vit_tiny, vit_small

using namespace loom;

namespace {

double median_ms(int steps, const std::function<void()>& step) {
  for (int i = 0; i < 2; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 128;
  int steps = 5, threads = 2;
  std::string model_name = "vit_tiny";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--batch") batch = std::stoll(value);
    else if (flag == "--steps") steps = std::stoi(value);
    else if (flag == "--threads") threads = std::stoi(value);
    else if (flag == "--model") model_name = value;
    else {
      std::fprintf(stderr, "bench_vit: unknown flag %s (expected --batch --steps --threads --model)\n", flag.c_str());
      return 2;
    }
  }
  omp_set_num_threads(threads);
  manual_seed(0);
  {
    Tensor q = randn({batch, 3, 65, 64}).requires_grad_(true), k = randn({batch, 3, 65, 64}).requires_grad_(true);
    Tensor v = randn({batch, 3, 65, 64}).requires_grad_(true), g = randn({batch, 3, 65, 64});
    const double ms = median_ms(steps, [&] { scaled_dot_product_attention(q, k, v).backward(g); });
    std::printf("sdpa ms=%.3f\n", ms);
  }
  auto model = model_name == "vit_small" ? nn::vit_small() : nn::vit_tiny();
  optim::AdamW opt(optim::param_groups_weight_decay(*model, 0.05, model->no_weight_decay()), {.lr = 1e-3});
  Tensor images = randn({batch, 3, 32, 32}), labels = randint(0, 10, {batch});
  const int64_t system_allocations_before = memory_stats(Device()).system_allocations;
  const double ms = median_ms(steps, [&] {
    opt.zero_grad();
    Tensor loss = cross_entropy((*model)(images), labels);
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
  });
  const AllocatorStats stats = memory_stats(Device());
  std::printf("train img_s=%.1f ms=%.1f peak_mib=%.1f system_allocations=%lld\n",
              static_cast<double>(batch) * 1000.0 / ms, ms, static_cast<double>(stats.peak_allocated_bytes) / (1 << 20),
              static_cast<long long>(stats.system_allocations - system_allocations_before));
  return 0;
}
