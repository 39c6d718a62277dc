// model_parallel_minimal: one model cut into two stages on two devices, one batch at a
// time: the "model doesn't fit on one device" recipe of PyTorch's model-parallel tutorial
// (layers placed with .to('cuda:1'), the activation moved between them in forward).
//   build/examples/model_parallel_minimal [--max-steps N --synthetic]
//
// Only one device works at any moment (stage 0 forward, stage 1 forward, stage 1
// backward, stage 0 backward): the point is memory, each device holds half the model.
// pipeline_minimal.cpp keeps both devices busy with micro-batches (docs/pipeline.md).
#include <cstdio>

#include "cuda/device.h"               // defines: cuda::device_count
#include "data/dataloader.h"           // defines: DataLoader
#include "examples/minimal.h"          // defines: --max-steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                   // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"              // defines: SGD
#include "nn/resnet.h"                 // defines: resnet18, ResNet::sequential
#include "parallel/model_parallel.h"   // defines: ModelParallel

using namespace loom;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  // Two GPUs, or two CPU virtual devices (same memory, but every tensor knows its device,
  // so a copy the code forgot is an error, not luck).
  const std::vector<Device> devices =
      cuda::device_count() >= 2 ? std::vector<Device>{"cuda:0", "cuda:1"} : std::vector<Device>{"cpu:0", "cpu:1"};

  // The ResNet as a list of 14 layers: conv1, bn1, relu, 8 residual blocks, avgpool,
  // flatten, fc. Stage 0 takes the first 7 (the stem and layer1-2), stage 1 the other 7;
  // parallel::balance_by_time() measures the layers and balances them instead.
  auto model = nn::resnet18(10);
  // self.seq1 = nn.Sequential(...).to('cuda:0'); self.seq2 = nn.Sequential(...).to('cuda:1')
  auto mp = std::make_shared<parallel::ModelParallel>(model->sequential(), devices, std::vector<int64_t>{7, 7});
  std::printf("ModelParallel: %s\n", mp->extra_repr().c_str());

  data::DataLoader loader(examples::cifar10_train_set(flags),
                          {.batch_size = 128, .shuffle = true, .num_workers = 2, .pin_memory = true});
  // The stages share the model's parameters (each now on its stage's device).
  optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  nn::CrossEntropyLoss criterion;

  int64_t step = 0;  // for --max-steps
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    Tensor loss;
    for (data::Batch& batch : loader) {
      if (!flags.runs(step++)) break;
      // forward: x = self.seq2(self.seq1(x).to('cuda:1')); the input goes to stage 0's
      // device, the logits come out on stage 1's, where the labels must be too.
      Tensor logits = (*mp)(batch.data);
      loss = criterion(logits, batch.target.to(logits.device()));
      optimizer.zero_grad();
      loss.backward();  // back through stage 1, the copy, then stage 0
      optimizer.step();
    }
    if (loss.defined()) std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch + 1), loss.item<float>());
  }
  return 0;
} catch (const std::exception& e) {  // any error, loom::Error or not: one line, exit status 1
  std::fprintf(stderr, "model_parallel_minimal: error: %s\n", e.what());
  return 1;
}
