"""PyTorch 1.13's pipeline (torch.distributed.pipeline.sync.Pipe, torchgpipe's GPipe) on
the job loom's `train_cifar10 --mode pipeline` runs in bench_modes.py.

    /usr/bin/python3 bench/pipeline_torch.py --chunks 4 --batch-size 64 --steps 12 --threads 2

The CIFAR ResNet18 of bench_train_torch.py, flattened to the 14 layers loom's
ResNet::sequential() lists (conv1, bn1, relu, 8 blocks, avgpool, flatten, fc) and cut 7 + 7
into two stages, trained with SGD(lr 0.1, momentum 0.9, weight decay 5e-4) on random
CIFAR-shaped batches of --batch-size split into --chunks micro-batches; --chunks 0 trains
the unsplit model instead. Both stages live on the CPU, so Pipe runs them on one worker
(it keeps one per device): the GPipe schedule with --threads intra-op threads.
--checkpoint is Pipe's (never | except_last | always); Pipe's own default is
except_last, which recomputes activations, so it is passed explicitly here and compared
with loom's --pipeline-checkpoint of the same name. Prints one
JSON line: {"median_step_s": ..., "img_per_s": ...}; the first step is not timed.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_torch import build_model  # noqa: E402  (the one ResNet18 definition)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=29631)
    parser.add_argument("--checkpoint", default="never", choices=["never", "except_last", "always"])
    args = parser.parse_args()
    import torch
    import torch.nn as nn
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    resnet = build_model(nn)
    layers = [resnet.conv1, resnet.bn1, resnet.relu]
    for stage in (resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4):
        layers += list(stage)
    layers += [resnet.avgpool, nn.Flatten(1), resnet.fc]
    if args.chunks > 0:
        import torch.distributed.rpc as rpc
        from torch.distributed.pipeline.sync import Pipe
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
        rpc.init_rpc("bench", rank=0, world_size=1)  # Pipe needs the RPC framework
        model = Pipe(nn.Sequential(nn.Sequential(*layers[:7]), nn.Sequential(*layers[7:])), chunks=args.chunks,
                     checkpoint=args.checkpoint)
        forward = lambda x: model(x).local_value()  # noqa: E731
    else:
        model = nn.Sequential(*layers)
        forward = model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    criterion = nn.CrossEntropyLoss()
    times = []
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 3, 32, 32)
        y = torch.randint(0, 10, (args.batch_size,))
        start = time.perf_counter()
        loss = criterion(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step > 0:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"median_step_s": median, "img_per_s": args.batch_size / median}), flush=True)
    if args.chunks > 0:
        rpc.shutdown()


if __name__ == "__main__":
    main()
