// dp_minimal: DataParallel, one process driving several devices: PyTorch's nn.DataParallel.
//   build/examples/dp_minimal [--max-steps N --synthetic]
//
// The training loop is the single-device one. Each forward scatters the batch over the
// devices, runs a replica of the model on each (one thread per device), and gathers the
// outputs on the first; backward sums every replica's gradients into the model's own
// parameters. Without GPUs the devices are CPU virtual devices cpu:0 and cpu:1, which
// split the OpenMP threads between them (docs/data_parallel.md).
#include <cstdio>

#include "cuda/device.h"               // defines: cuda::device_count
#include "data/dataloader.h"           // defines: DataLoader
#include "examples/minimal.h"          // defines: --max-steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                   // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"              // defines: SGD
#include "nn/resnet.h"                 // defines: resnet18
#include "parallel/data_parallel.h"    // defines: DataParallel

using namespace loom;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  // devices = every GPU, or two CPU virtual devices
  std::vector<Device> devices;
  for (int i = 0; i < cuda::device_count(); ++i) devices.emplace_back(DeviceType::CUDA, i);
  if (devices.empty()) devices = {Device("cpu:0"), Device("cpu:1")};

  // model = torchvision.models.resnet18(num_classes=10).to(devices[0])
  auto model = nn::resnet18(10);
  model->to(devices[0]);
  // model = nn.DataParallel(model, device_ids=devices)
  auto dp = std::make_shared<parallel::DataParallel>(model, devices);
  std::printf("DataParallel over %s\n", dp->extra_repr().c_str());

  // loader = DataLoader(CIFAR10(...), batch_size=128, shuffle=True, num_workers=2)
  data::DataLoader loader(examples::cifar10_train_set(flags),
                          {.batch_size = 128, .shuffle = true, .num_workers = 2, .pin_memory = true});
  // optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  nn::CrossEntropyLoss criterion;

  int64_t step = 0;  // for --max-steps
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    Tensor loss;
    for (data::Batch& batch : loader) {
      if (!flags.runs(step++)) break;
      // The whole batch goes to the first device; DataParallel scatters it from there.
      Tensor images = batch.data.to(devices[0]), labels = batch.target.to(devices[0]);
      // loss = criterion(model(images), labels): the outputs are gathered on devices[0]
      loss = criterion((*dp)(images), labels);
      optimizer.zero_grad();
      loss.backward();  // every replica's gradients, summed into model's parameters
      optimizer.step();
    }
    if (loss.defined()) std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch + 1), loss.item<float>());
  }
  return 0;
} catch (const std::exception& e) {  // any error, loom::Error or not: one line, exit status 1
  std::fprintf(stderr, "dp_minimal: error: %s\n", e.what());
  return 1;
}
