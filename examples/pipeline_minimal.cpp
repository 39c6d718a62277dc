// pipeline_minimal: ResNet18 in two stages, each batch cut into 4 micro-batches that flow
// through them under the 1F1B schedule. Two ways, one program:
//   build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/pipeline_minimal
//       one process per stage, activations and gradients by send/recv: PyTorch's
//       torch.distributed.pipelining (PipelineStage + Schedule1F1B) under torchrun;
//   build/examples/pipeline_minimal
//       one process, each stage on its own thread and device (cpu:0, cpu:1 or two GPUs):
//       torchgpipe's GPipe(model, balance=[7, 7], chunks=4).
// Both take [--max-steps N --synthetic]. While stage 1 works on micro-batch m, stage 0 already
// works on m + 1, so both are busy except in the bubble at the start and end of a step:
// (S - 1) / (M + S - 1) of it with S stages and M micro-batches, 1/5 here (docs/pipeline.md).
#include <cstdio>
#include <cstdlib>     // defines: getenv
#include <functional>  // defines: std::function

#include "cuda/device.h"                      // defines: cuda::device_count
#include "data/dataloader.h"                  // defines: DataLoader
#include "examples/minimal.h"                 // defines: --max-steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                          // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"                     // defines: SGD
#include "nn/resnet.h"                        // defines: resnet18, ResNet::sequential
#include "parallel/comm/process_group.h"      // defines: init_process_group, default_group
#include "parallel/pipeline/pipeline.h"       // defines: Pipeline (one process)
#include "parallel/pipeline/pipeline_stage.h" // defines: PipelineStage (one process per stage)
#include "parallel/pipeline/schedule.h"       // defines: make_schedule, draw (the schedule as a picture)

using namespace loom;
namespace pp = parallel::pipeline;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  const bool launched = std::getenv("WORLD_SIZE") != nullptr;  // by loomrun: one process per stage
  // The ResNet as a list of 14 layers (conv1, bn1, relu, 8 blocks, avgpool, flatten, fc),
  // 7 per stage, built alike on every rank; the loss is computed on the last stage.
  auto model = nn::resnet18(10);
  nn::CrossEntropyLoss criterion;
  auto loss_fn = [&](const Tensor& out, const Tensor& y) { return criterion(out, y); };
  std::shared_ptr<nn::Module> stages;  // what the optimizer steps: this process's stages
  std::function<Tensor(const Tensor&, const Tensor&)> step;  // one batch's forward + backward
  if (launched) {
    // dist.init_process_group(); stage = PipelineStage(this rank's layers, rank, world_size, device)
    distributed::init_process_group("gloo");
    auto stage = std::make_shared<pp::PipelineStage>(model->sequential(), std::vector<int64_t>{7, 7},
                                                     distributed::default_group(), Device("cpu"), /*n_microbatches=*/4,
                                                     "1f1b", loss_fn);
    // schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn); schedule.step(x, target=y)
    step = [stage](const Tensor& x, const Tensor& y) { return stage->step(x, y).loss; };  // loss: every rank's
    stages = stage;
  } else {
    const std::vector<Device> devices =
        cuda::device_count() >= 2 ? std::vector<Device>{"cuda:0", "cuda:1"} : std::vector<Device>{"cpu:0", "cpu:1"};
    auto pipe = std::make_shared<pp::Pipeline>(model->sequential(), devices, std::vector<int64_t>{7, 7},
                                               /*n_microbatches=*/4, "1f1b", loss_fn);
    step = [pipe](const Tensor& x, const Tensor& y) { return pipe->step(x, y).loss; };
    stages = pipe;
  }
  const bool main_process = distributed::is_main_process();
  if (main_process) {
    std::printf("%s: %s\n", stages->type_name().c_str(), stages->extra_repr().c_str());
    // Each stage's order of forwards (F) and backwards (B) per clock tick; dots: the bubble.
    std::puts(pp::draw(pp::make_schedule("1f1b", 2, 4)).c_str());
  }
  // Every rank reads the same batches (same seed): stage 0 uses the images, the last the labels.
  data::DataLoader loader(examples::cifar10_train_set(flags),
                          {.batch_size = 128, .shuffle = true, .num_workers = 2, .pin_memory = true});
  optim::SGD optimizer(stages->parameters(), {.lr = 0.1, .momentum = 0.9});

  int64_t taken = 0;  // for --max-steps
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    Tensor loss;
    for (data::Batch& batch : loader) {
      if (!flags.runs(taken++)) break;
      optimizer.zero_grad();
      // output = model(images); loss = criterion(output, labels); loss.backward() -- in one
      // call, since the schedule interleaves the micro-batches' forwards and backwards.
      loss = step(batch.data, batch.target);
      optimizer.step();  // .grad(): the whole batch's mean-loss gradient
    }
    if (main_process && loss.defined())
      std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch + 1), loss.to(kFloat64).item<double>());
  }
  if (launched) distributed::destroy_process_group();
  return 0;
} catch (const std::exception& e) {  // any error, loom::Error or not: one line, exit status 1
  std::fprintf(stderr, "pipeline_minimal: error: %s\n", e.what());
  return 1;
}
