// ddp_minimal: PyTorch's examples/reference/train_ddp.py in loom, line for line (each block: the Python it mirrors).
//   build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/ddp_minimal [--max-steps N --synthetic]
#include <cstdio>
#include <cstdlib>  // defines: getenv, atoi

#include "cuda/device.h"                             // defines: cuda::is_available
#include "data/dataloader.h"                         // defines: DataLoader
#include "data/distributed_sampler.h"                // defines: DistributedSampler
#include "examples/minimal.h"                        // defines: --max-steps N, --synthetic, cifar10_train_set
#include "nn/loss.h"                                 // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"                            // defines: SGD
#include "nn/resnet.h"                               // defines: resnet18
#include "parallel/comm/process_group.h"             // defines: init_process_group, get_rank
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DistributedDataParallel

using namespace loom;

int main(int argc, char** argv) try {
  const auto flags = examples::parse_minimal_flags(argc, argv);
  // local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)
  const int local_rank = std::atoi(std::getenv("LOCAL_RANK") ? std::getenv("LOCAL_RANK") : "0");
  const Device device = cuda::is_available() ? Device(DeviceType::CUDA, local_rank) : Device("cpu");
  // dist.init_process_group(backend="nccl", init_method="env://")
  distributed::init_process_group(device.is_cuda() ? "nccl" : "gloo", "env://");
  // model = torchvision.models.resnet18(num_classes=10).cuda(local_rank)
  auto model = nn::resnet18(10);
  model->to(device);
  // model = DDP(model, device_ids=[local_rank])
  auto ddp = std::make_shared<ddp::DistributedDataParallel>(model, distributed::default_group());
  // transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(...)])
  // dataset = torchvision.datasets.CIFAR10(root="./data", train=True, transform=transform)
  auto dataset = examples::cifar10_train_set(flags);  // (examples/minimal.h; --synthetic: random images)
  // sampler = DistributedSampler(dataset)
  auto sampler = std::make_shared<data::DistributedSampler>(dataset->size(), distributed::get_world_size(),
                                                            distributed::get_rank());
  // loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=2, pin_memory=True)
  data::DataLoader loader(dataset, {.batch_size = 128, .sampler = sampler, .num_workers = 2, .pin_memory = true});
  // optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
  optim::SGD optimizer(ddp->parameters(), {.lr = 0.1, .momentum = 0.9});
  // criterion = nn.CrossEntropyLoss()
  nn::CrossEntropyLoss criterion;
  int64_t step = 0;  // for --max-steps
  // for epoch in range(3):
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    //   sampler.set_epoch(epoch)        # else every epoch repeats epoch 0's order
    sampler->set_epoch(epoch);
    Tensor loss;
    //   for images, labels in loader:
    for (data::Batch& batch : loader) {
      if (!flags.runs(step++)) break;
      //     images, labels = images.cuda(local_rank), labels.cuda(local_rank)
      Tensor images = batch.data.to(device), labels = batch.target.to(device);
      //     loss = criterion(model(images), labels)
      loss = criterion((*ddp)(images), labels);
      //     optimizer.zero_grad(); loss.backward(); optimizer.step()
      optimizer.zero_grad();
      loss.backward();  // returns with every rank's gradients averaged
      optimizer.step();
    }
    //   if dist.get_rank() == 0: print(f"epoch {epoch + 1} loss {loss.item():.4f}")
    if (distributed::get_rank() == 0 && loss.defined())
      std::printf("epoch %lld loss %.4f\n", static_cast<long long>(epoch + 1), loss.item<float>());
  }
  // dist.destroy_process_group()
  distributed::destroy_process_group();
  return 0;
} catch (const std::exception& e) {  // any error, loom::Error or not: one line, exit status 1
  std::fprintf(stderr, "ddp_minimal: error: %s\n", e.what());
  return 1;
}
