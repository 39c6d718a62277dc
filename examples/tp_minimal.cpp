// tp_minimal: ddp_minimal with tensor parallelism in place of DDP, as PyTorch's tensor
// parallel tutorial splits a model with parallelize_module: each rank holds 1/N of every
// block's two 3x3 convolutions and computes 1/N of their channels, and both ranks train the
// one model on the same batches (docs/tensor_parallel.md). What differs from ddp_minimal is marked.
//   build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/tp_minimal [--max-steps N --synthetic]
#include <cstdio>

#include "data/dataloader.h"                     // defines: DataLoader
#include "data/distributed_sampler.h"            // defines: DistributedSampler
#include "examples/minimal.h"                    // defines: --max-steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                             // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"                        // defines: SGD
#include "nn/resnet.h"                           // defines: resnet18
#include "parallel/comm/process_group.h"         // defines: init_process_group, default_group, get_rank
#include "parallel/tensor/parallelize_module.h"  // defines: parallelize_module, ColwiseParallel, RowwiseParallel
#include "parallel/tensor/tp_state_dict.h"       // defines: full_state_dict

using namespace loom;
using namespace loom::distributed;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  // dist.init_process_group(backend="gloo")
  init_process_group("gloo", "env://");
  // tp_mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))["tp"]   <- every rank one tp group
  auto tp = default_group();
  // model = torchvision.models.resnet18(num_classes=10)
  auto model = nn::resnet18(10);
  // parallelize_module(model, tp_mesh, {"layer*.*.conv1": ColwiseParallel(), ...})   <- instead of DDP
  // conv1 keeps 1/N of its output channels, bn1 and relu run on them, conv2 keeps 1/N of its
  // input channels and all-reduces its partial sums: one all-reduce per block each way.
  const StatePlacements placements = parallelize_module(*model, tp, {
      {"layer*.*.conv1", ColwiseParallel()},
      {"layer*.*.bn1", ChannelParallel()},
      {"layer*.*.conv2", RowwiseParallel()},
  });
  // dataset = torchvision.datasets.CIFAR10(root="./data", train=True, transform=transform)
  auto dataset = examples::cifar10_train_set(flags);
  // sampler = DistributedSampler(dataset, num_replicas=1, rank=0)      <- every tp rank the same batches
  auto sampler = std::make_shared<data::DistributedSampler>(dataset->size(), 1, 0);
  // loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=2)
  data::DataLoader loader(dataset, {.batch_size = 128, .sampler = sampler, .num_workers = 2});
  // optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   <- this rank's shards and the rest
  optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  // criterion = nn.CrossEntropyLoss()
  nn::CrossEntropyLoss criterion;
  int64_t step = 0;  // for --max-steps
  // for epoch in range(3):
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    //   sampler.set_epoch(epoch)
    sampler->set_epoch(epoch);
    Tensor loss;
    //   for images, labels in loader:
    for (data::Batch& batch : loader) {
      if (!flags.runs(step++)) break;
      //     loss = criterion(model(images), labels)       <- each block's conv2 output all-reduced
      loss = criterion((*model)(batch.data), batch.target);
      //     optimizer.zero_grad(); loss.backward(); optimizer.step()
      optimizer.zero_grad();
      loss.backward();  // each block's input gradient all-reduced; no gradient is reduced after
      optimizer.step();
    }
    //   if dist.get_rank() == 0: print(f"epoch {epoch + 1} loss {loss.item():.4f}")
    if (get_rank() == 0 && loss.defined())
      std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch + 1), loss.item<float>());
  }
  // state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))   <- a collective
  OrderedDict<Tensor> state = full_state_dict(*model, placements);
  // if dist.get_rank() == 0: print(len(state), "tensors, as a single-process model names and shapes them")
  const int64_t mine = model->layer1->children()[0]->named_parameters()["conv1.weight"].size(0);
  if (get_rank() == 0)
    std::printf("full state dict: %zu tensors; layer1.0.conv1.weight has %lld output channels, this rank %lld\n",
                state.size(), static_cast<long long>(state["layer1.0.conv1.weight"].size(0)),
                static_cast<long long>(mine));
  // dist.destroy_process_group()
  destroy_process_group();
  return 0;
} catch (const std::exception& e) {  // any error, loom::Error or not: one line, exit status 1
  std::fprintf(stderr, "tp_minimal: error: %s\n", e.what());
  return 1;
}
