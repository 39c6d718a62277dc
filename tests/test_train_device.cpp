// train/ on a device: --device cuda is a clear error on a machine without a GPU
// (runs everywhere), and a few training steps on the GPU follow the CPU's (needs a GPU).
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/factory.h"               // defines: zeros, full
#include "core/memory.h"                // defines: set_device_memory_limit, kNoMemoryLimit
#include "cuda/backends.h"              // defines: cuda::set_cudnn_allow_tf32
#include "cuda/device.h"                // defines: cuda::is_available, unavailable_reason
#include "train/device.h"      // defines: training_device
#include "train/trainer.h"     // defines: TrainConfig, train_cifar10

using namespace loom;
using namespace loom::training;

namespace {

const bool kGpu = cuda::is_available();

// A tiny synthetic run: no dataset on disk, a few steps.
TrainConfig tiny_run(const std::string& device) {
  TrainConfig c;
  c.model.name = "tiny";
  c.data.synthetic = true;
  c.data.synthetic_size = 64;
  c.data.batch_size = 16;
  c.training.epochs = 1;
  c.training.max_steps = 3;
  c.data.eval_limit = 32;
  c.data.workers = 0;
  c.metrics.progress = false;
  c.data.augment = false;
  c.training.device = device;
  return c;
}

std::string error_of(const TrainConfig& config) {
  try {
    (void)train_cifar10(config);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("--device cuda without a GPU is a loom::Error that names the reason, not a crash" * doctest::skip(kGpu)) {
  for (const std::string device : {"cuda", "cuda:1"}) {
    const std::string message = error_of(tiny_run(device));
    INFO("--device ", device, " says: ", message);
    CHECK(message.find("--device " + device) != std::string::npos);
    if (cuda::is_compiled()) {
      CHECK(message.find("no CUDA device is available") != std::string::npos);
      CHECK(message.find(cuda::unavailable_reason()) != std::string::npos);
    } else {
      CHECK(message.find("built without the CUDA backend") != std::string::npos);
    }
    CHECK(message.find("--device cpu") != std::string::npos);  // what to do instead
  }
  // A malformed device is also a flag error, on any machine.
  CHECK(error_of(tiny_run("gpu:0")).find("--device") != std::string::npos);
}

TEST_CASE("training_device accepts the CPU devices everywhere") {
  CHECK(training_device("cpu") == Device("cpu"));
  CHECK(training_device("cpu:1") == Device("cpu:1"));
}

TEST_CASE("a few training steps on the GPU follow the CPU's" * doctest::skip(!kGpu)) {
  CHECK(training_device("cuda") == Device("cuda:0"));
  CHECK(training_device("cuda:0", 5) == Device("cuda:0"));  // an explicit index wins
  // TF32 (cuDNN's default, as PyTorch's) rounds convolution inputs to 10 bits: not the
  // CPU's float32 math that the bound below assumes.
  const bool tf32 = cuda::cudnn_allow_tf32();
  cuda::set_cudnn_allow_tf32(false);
  const TrainResult cpu = train_cifar10(tiny_run("cpu"));
  const TrainResult gpu = train_cifar10(tiny_run("cuda"));
  cuda::set_cudnn_allow_tf32(tf32);
  CHECK(gpu.steps == cpu.steps);
  // Same seed, weights, batches and update rule; float sums in other orders (cuDNN,
  // reductions) move the loss in its fourth digit at most over three steps.
  CHECK(std::abs(gpu.train_loss - cpu.train_loss) <= 1e-3 * std::abs(cpu.train_loss));
  CHECK(std::abs(gpu.test_loss - cpu.test_loss) <= 1e-3 * std::abs(cpu.test_loss));
}

TEST_CASE("--device-memory-limit: a budget the step cannot fit is PyTorch's OutOfMemoryError; one that fits trains") {
  TrainConfig tight = tiny_run("cpu:2");  // cpu:2: the dataset and the loader's batches stay on cpu, outside
  tight.training.device_memory_limit = "1MiB";
  const std::string message = error_of(tight);
  INFO(message);
  CHECK(message.find("CPU out of memory. Tried to allocate ") != std::string::npos);
  CHECK(message.find("Device cpu:2 has a total capacity of ") != std::string::npos);
  CHECK(message.find("1.00 MiB allowed") != std::string::npos);
  TrainConfig roomy = tiny_run("cpu:3");
  roomy.training.device_memory_limit = "64MiB";
  CHECK(std::isfinite(train_cifar10(roomy).train_loss));
  TrainConfig bad = tiny_run("cpu");
  bad.training.device_memory_limit = "1.5 gigs";
  CHECK(error_of(bad).find("--device-memory-limit: expected a memory size such as 1.5GiB") != std::string::npos);
  for (const char* device : {"cpu:2", "cpu:3"}) set_device_memory_limit(kNoMemoryLimit, Device(device));
}

TEST_CASE("read_loss_and_correct: a loss on another device than the logits (--pp with --device cpu:1)") {
  const Tensor logits = zeros({2, 3}).to(Device("cpu:1"));
  const Tensor labels = zeros({2}, TensorOptions(kInt64)).to(Device("cpu:1"));
  const std::pair<float, int64_t> read = read_loss_and_correct(full({}, 0.5), logits, labels);  // the loss on cpu
  CHECK(read.first == 0.5f);
  CHECK(read.second == 2);
}
