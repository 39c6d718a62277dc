// bench_train_gpu: loom's ResNet18-CIFAR training throughput on a GPU, one configuration
// per process; bench_train_gpu.py runs it and bench_train_torch.py side by side and
// prints the table (scripts/gpu_check.sh runs that on the lent GPU machine).
//
//   build/bench/bench_train_gpu --batch=128 --precision=bf16 --warmup=5 --steps=20
//
// Precisions (the names of the table's rows):
//   fp32  float32, TF32 off in cuBLAS and cuDNN (what float32 means)
//   tf32  float32 tensors, TF32 tensor-core math in cuBLAS and cuDNN
//         (torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True)
//   bf16  autocast to bfloat16 around forward + loss (autograd/autocast.h), float32
//         parameters, gradients and optimizer
//   fp16  autocast to float16 with a GradScaler (nn/optim/grad_scaler.h)
// A step is the one users write: forward, CrossEntropyLoss, zero_grad, backward,
// SGD(lr 0.1, momentum 0.9, weight decay 5e-4).step(), on one synthetic batch already on
// the GPU (only the model is timed). Each step is timed by a pair of CUDA events on the
// compute stream, without host synchronisation between steps -- so the host may queue
// ahead, as in training -- and the number is batch / median step time over --steps.
//
// Prints `result train BATCH PRECISION IMG_PER_S MEDIAN_MS PEAK_MIB`; errors go to stderr
// with exit code 1.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autocast.h"       // defines: autocast::Guard
#include "autograd/ops.h"            // defines: randn, randint
#include "core/allocator.h"          // defines: memory_stats
#include "cuda/backends.h"           // defines: set_allow_tf32, set_cudnn_allow_tf32
#include "cuda/device.h"             // defines: Event, synchronize, is_available
#include "nn/loss.h"                 // defines: CrossEntropyLoss
#include "nn/optim/grad_scaler.h"    // defines: GradScaler
#include "nn/optim/sgd.h"            // defines: SGD
#include "nn/resnet.h"               // defines: resnet18

namespace {

using namespace loom;

struct Options {
  int64_t batch = 128;
  std::string precision = "fp32";
  int warmup = 5;
  int steps = 20;
  std::string device = "cuda:0";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("batch")) o.batch = std::atoll(v);
    else if (const char* v = value("precision")) o.precision = v;
    else if (const char* v = value("warmup")) o.warmup = std::atoi(v);
    else if (const char* v = value("steps")) o.steps = std::atoi(v);
    else if (const char* v = value("device")) o.device = v;
    else if (arg == "--help" || arg == "-h") {
      std::printf("usage: bench_train_gpu [--batch=128] [--precision=fp32|tf32|bf16|fp16] [--warmup=5] "
                  "[--steps=20] [--device=cuda:0]\n");
      std::exit(0);
    } else {
      LOOM_FAIL("bench_train_gpu: unknown argument '", arg, "' (see --help)");
    }
  }
  LOOM_CHECK(o.precision == "fp32" || o.precision == "tf32" || o.precision == "bf16" || o.precision == "fp16",
             "bench_train_gpu: --precision expects fp32, tf32, bf16 or fp16, got '", o.precision, "'");
  LOOM_CHECK(o.batch > 0 && o.steps > 0 && o.warmup >= 0, "bench_train_gpu: expected --batch > 0, --steps > 0, "
             "--warmup >= 0");
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

int run(const Options& o) {
  LOOM_CHECK(cuda::is_available(), "bench_train_gpu: no usable GPU: ", cuda::unavailable_reason());
  const Device device(o.device);
  LOOM_CHECK(device.type == DeviceType::CUDA, "bench_train_gpu: --device expects cuda or cuda:N, got ", o.device);
  cuda::set_device(device.index);
  const bool tf32 = o.precision == "tf32";
  cuda::set_allow_tf32(tf32);
  cuda::set_cudnn_allow_tf32(tf32);  // fp32 means fp32 in cuDNN too (its default is on)

  manual_seed(0);
  auto model = nn::resnet18(10);
  model->to(device);
  model->train();
  nn::CrossEntropyLoss criterion;
  optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
  optim::GradScaler scaler({.enabled = o.precision == "fp16"});
  const bool amp = o.precision == "bf16" || o.precision == "fp16";
  const DType amp_dtype = o.precision == "fp16" ? kFloat16 : kBFloat16;

  Generator gen(0);
  Tensor images = randn({o.batch, 3, 32, 32}, TensorOptions(kFloat32), &gen).to(device);
  Tensor labels = randint(0, 10, {o.batch}, TensorOptions(kInt64), &gen).to(device);

  auto step = [&] {
    Tensor loss;
    {
      autocast::Guard guard(DeviceType::CUDA, amp_dtype, /*enabled=*/amp);
      loss = criterion((*model)(images), labels);
    }
    optimizer.zero_grad();
    scaler.scale(loss).backward();
    scaler.step(optimizer);
    scaler.update();
  };

  for (int i = 0; i < o.warmup; ++i) step();
  cuda::synchronize(device.index);
  std::vector<cuda::Event> starts, ends;
  for (int i = 0; i < o.steps; ++i) {
    starts.emplace_back(/*enable_timing=*/true);
    ends.emplace_back(/*enable_timing=*/true);
  }
  for (int i = 0; i < o.steps; ++i) {
    starts[i].record();
    step();
    ends[i].record();
  }
  cuda::synchronize(device.index);
  std::vector<double> ms;
  for (int i = 0; i < o.steps; ++i) ms.push_back(starts[i].elapsed_time(ends[i]));
  const double med = median(ms);
  const double peak_mib = static_cast<double>(memory_stats(device).peak_allocated_bytes) / (1024.0 * 1024.0);
  std::printf("result train %lld %s %.2f %.3f %.0f\n", static_cast<long long>(o.batch), o.precision.c_str(),
              static_cast<double>(o.batch) / (med / 1e3), med, peak_mib);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "bench_train_gpu: error: %s\n", e.what());
    return 1;
  }
}
