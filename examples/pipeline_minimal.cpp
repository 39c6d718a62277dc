// pipeline_minimal: the model's two stages on two devices, each batch cut into 4
// micro-batches that flow through them under the 1F1B schedule: torchgpipe's
// GPipe(model, balance=[7, 7], chunks=4), or PyTorch's torch.distributed.pipelining with
// Schedule1F1B, in one process (each stage on its own thread).
//   build/examples/pipeline_minimal [--steps N --synthetic]
//
// While stage 1 works on micro-batch m, stage 0 already works on m + 1, so both devices
// are busy except in the bubble at the start and end of each step: (S - 1) / (M + S - 1)
// of it with S stages and M micro-batches, 1/5 here (docs/pipeline.md draws it).
#include <cstdio>

#include "cuda/device.h"                  // defines: cuda::device_count
#include "data/dataloader.h"              // defines: DataLoader
#include "examples/minimal.h"             // defines: --steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                      // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"                 // defines: SGD
#include "nn/resnet.h"                    // defines: resnet18, ResNet::sequential
#include "parallel/pipeline/pipeline.h"   // defines: Pipeline
#include "parallel/pipeline/schedule.h"   // defines: make_schedule, draw (the schedule as a picture)

using namespace loom;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  const std::vector<Device> devices =
      cuda::device_count() >= 2 ? std::vector<Device>{"cuda:0", "cuda:1"} : std::vector<Device>{"cpu:0", "cpu:1"};

  // The ResNet's 14 layers, 7 per stage (as model_parallel_minimal.cpp).
  auto model = nn::resnet18(10);
  nn::CrossEntropyLoss criterion;
  // pipe = GPipe(model, balance=[7, 7], devices=devices, chunks=4), schedule 1F1B. The
  // pipeline computes each micro-batch's loss on the last stage, so it is given the
  // criterion; "gpipe" runs every forward before any backward (more activations alive).
  parallel::pipeline::Pipeline pipe(model->sequential(), devices, {7, 7}, /*chunks=*/4, "1f1b",
                                    [&](const Tensor& out, const Tensor& y) { return criterion(out, y); });
  std::printf("Pipeline: %s\n", pipe.extra_repr().c_str());
  // Each stage's order of forwards (F) and backwards (B) per clock tick; dots: the bubble.
  std::puts(parallel::pipeline::draw(parallel::pipeline::make_schedule("1f1b", 2, 4)).c_str());

  data::DataLoader loader(examples::cifar10_train_set(flags),
                          {.batch_size = 128, .shuffle = true, .num_workers = 2, .pin_memory = true});
  optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9});

  int64_t step = 0;  // for --steps
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    Tensor loss;
    for (data::Batch& batch : loader) {
      if (!flags.runs(step++)) break;
      optimizer.zero_grad();
      // output = pipe(images); loss = criterion(output, labels); loss.backward() -- in one
      // call, since the schedule interleaves the micro-batches' forwards and backwards.
      auto result = pipe.step(batch.data, batch.target);
      optimizer.step();  // .grad(): the whole batch's mean-loss gradient
      loss = result.loss;
    }
    if (loss.defined()) std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch), loss.item<float>());
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "pipeline_minimal: error: %s\n", e.what());
  return 1;
}
