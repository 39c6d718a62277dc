// fsdp_minimal: ddp_minimal with FullyShardedDataParallel in place of DDP, as PyTorch's FSDP
// tutorial changes examples/reference/train_ddp.py: each rank keeps 1/N of the parameters, gradients and
// optimizer state (docs/fsdp.md, docs/sharding.md). What differs from ddp_minimal is marked.
//   build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/fsdp_minimal [--max-steps N --synthetic]
#include <cstdio>

#include "data/dataloader.h"                           // defines: DataLoader
#include "data/distributed_sampler.h"                  // defines: DistributedSampler
#include "examples/minimal.h"                          // defines: --max-steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                                   // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"                              // defines: SGD
#include "nn/resnet.h"                                 // defines: resnet18
#include "parallel/comm/process_group.h"               // defines: init_process_group, get_rank
#include "parallel/fsdp/fully_sharded_data_parallel.h" // defines: FullyShardedDataParallel, ShardingStrategy
#include "parallel/fsdp/state_dict.h"                  // defines: full_state_dict

using namespace loom;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  // dist.init_process_group(backend="gloo")            (CPU; "nccl" on GPUs, as in ddp_minimal)
  distributed::init_process_group("gloo", "env://");
  // model = torchvision.models.resnet18(num_classes=10)
  auto model = nn::resnet18(10);
  // model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({BasicBlock}),      <- instead of DDP
  //              sharding_strategy=ShardingStrategy.FULL_SHARD)
  // (loom's default policy: each BasicBlock, the stem and the head are units)
  auto fsdp = std::make_shared<fsdp::FullyShardedDataParallel>(
      model, distributed::default_group(), fsdp::FSDPOptions{.sharding_strategy = fsdp::ShardingStrategy::FULL_SHARD});
  // dataset = torchvision.datasets.CIFAR10(root="./data", train=True, transform=transform)
  auto dataset = examples::cifar10_train_set(flags);
  // sampler = DistributedSampler(dataset)
  auto sampler = std::make_shared<data::DistributedSampler>(dataset->size(), distributed::get_world_size(),
                                                            distributed::get_rank());
  // loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=2)
  data::DataLoader loader(dataset, {.batch_size = 128, .sampler = sampler, .num_workers = 2});
  // optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   <- FSDP's parameters: the shards
  optim::SGD optimizer(fsdp->parameters(), {.lr = 0.1, .momentum = 0.9});
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
      //     loss = criterion(model(images), labels)       <- each unit all-gathered just before it runs
      loss = criterion((*fsdp)(batch.data), batch.target);
      //     optimizer.zero_grad(); loss.backward(); optimizer.step()
      optimizer.zero_grad();
      loss.backward();  // each unit's gradients reduce-scattered into this rank's shard
      optimizer.step();  // steps 1/N of the model
    }
    //   if dist.get_rank() == 0: print(f"epoch {epoch + 1} loss {loss.item():.4f}")
    if (distributed::get_rank() == 0 && loss.defined())
      std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch + 1), loss.item<float>());
  }
  // with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT): state = model.state_dict()   <- a collective
  OrderedDict<Tensor> state = fsdp::full_state_dict(*fsdp);
  // if dist.get_rank() == 0: print(len(state), "tensors, as a single-process model names them")
  if (distributed::get_rank() == 0) std::printf("full state dict: %zu tensors, e.g. %s\n", state.size(),
                                                state.keys().front().c_str());
  // dist.destroy_process_group()
  distributed::destroy_process_group();
  return 0;
} catch (const std::exception& e) {  // any error, loom::Error or not: one line, exit status 1
  std::fprintf(stderr, "fsdp_minimal: error: %s\n", e.what());
  return 1;
}
