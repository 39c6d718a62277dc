"""train_ddp.py: ResNet18 on CIFAR-10 with PyTorch's DistributedDataParallel, the script that
loom's examples mirror. Nothing runs it (not the build, not the tests); it is here to be read
beside examples/ddp_minimal.cpp, whose every block is headed by the line of this file it
mirrors, and beside the trainer (examples/train_cifar10.cpp), whose defaults are its
constants: batch 128 per process, SGD lr 0.1, momentum 0.9, 3 epochs.

    torchrun --standalone --nproc_per_node 2 examples/reference/train_ddp.py
    build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/ddp_minimal   # loom's

Two differences to know when comparing numbers: loom's nn::resnet18 is the CIFAR variant
(3x3 stem, stride 1, no max-pool; nn/resnet.h), where torchvision's resnet18 keeps the
ImageNet stem; and the trainer adds weight decay 5e-4 (--weight-decay), which
ddp_minimal, like this script, leaves out.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")

    model = torchvision.models.resnet18(num_classes=10).cuda(local_rank)
    model = DDP(model, device_ids=[local_rank])

    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))])
    dataset = torchvision.datasets.CIFAR10(root="./data", train=True, transform=transform)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=2, pin_memory=True)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(3):
        sampler.set_epoch(epoch)  # else every epoch repeats epoch 0's order
        for images, labels in loader:
            images, labels = images.cuda(local_rank), labels.cuda(local_rank)
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
