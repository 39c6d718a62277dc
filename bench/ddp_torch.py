"""PyTorch's DistributedDataParallel (gloo) on the same job as loom's bench_ddp.py runs.

    /usr/bin/python3 bench/ddp_torch.py --world-size 2 --model resnet18 --batch-size 32 --steps 12
    /usr/bin/python3 bench/ddp_torch.py --zero-redundancy-optimizer ...   # DDP + ZeRO-1

--zero-redundancy-optimizer wraps the SGD in torch.distributed.optim.ZeroRedundancyOptimizer
(PyTorch's defaults: parameters_as_bucket_view=False, no overlap_with_ddp), loom's
--mode ddp --zero-redundancy-optimizer.

Starts --world-size processes (1 compute thread each), trains the CIFAR ResNet18 (or the
narrow `tiny` variant loom's --model tiny builds) on random CIFAR-shaped batches with
SGD(lr 0.1, momentum 0.9, weight decay 5e-4), and prints one JSON line from rank 0:
{"median_step_s": ..., "img_per_s": ...}. As loom's trainer, a step's time excludes
fetching the batch and the first step is not timed; img/s = world * batch / median step.
"""
import argparse
import json
import os
import statistics
import sys
import time


def build_model(nn, name):
    widths = {"resnet18": [64, 128, 256, 512], "tiny": [8, 16, 32, 64]}[name]
    blocks = {"resnet18": [2, 2, 2, 2], "tiny": [1, 1, 1, 1]}[name]

    class BasicBlock(nn.Module):
        def __init__(self, inp, planes, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inp != planes:
                self.downsample = nn.Sequential(nn.Conv2d(inp, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (self.downsample(x) if self.downsample is not None else x))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            layers, inp = [], widths[0]
            for s in range(4):
                stage = []
                for b in range(blocks[s]):
                    stage.append(BasicBlock(inp, widths[s], 2 if s > 0 and b == 0 else 1))
                    inp = widths[s]
                layers.append(nn.Sequential(*stage))
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(widths[3], 10)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


def worker(rank, args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(args.threads)  # Debian's build ignores OMP_NUM_THREADS
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.world_size)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(build_model(nn, args.model))
    if args.zero_redundancy_optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9,
                                      weight_decay=5e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps):
        images = torch.randn(args.batch_size, 3, 32, 32, generator=g)
        labels = torch.randint(0, 10, (args.batch_size,), generator=g)
        start = time.perf_counter()
        loss = criterion(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        if step > 0:
            times.append(time.perf_counter() - start)
    if rank == 0:
        median = statistics.median(times)
        print(json.dumps({"median_step_s": median, "img_per_s": args.world_size * args.batch_size / median,
                          "torch": torch.__version__}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "tiny"])
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--steps", type=int, default=12, help="the first is not timed")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per process")
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--zero-redundancy-optimizer", action="store_true",
                        help="SGD inside torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1)")
    args = parser.parse_args()
    try:
        import torch.multiprocessing as mp
    except ImportError:
        sys.exit(f"ddp_torch.py: PyTorch is not importable by {sys.executable}; "
                 "install it (Debian: apt-get install python3-torch) or pick another python")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    mp.spawn(worker, args=(args,), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
