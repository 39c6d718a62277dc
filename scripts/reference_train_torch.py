#!/usr/bin/env python3
"""PyTorch reference for train_cifar10: the same ResNet18, data order and update rule.

    build/examples/train_cifar10 --max-steps 0 --save /tmp/init.safetensors
    build/examples/train_cifar10 --init /tmp/init.safetensors --no-shuffle --no-augment \\
        --max-steps 40 --eval-limit 1000 --metrics-json /tmp/loom.json
    /usr/bin/python3 scripts/reference_train_torch.py --init /tmp/init.safetensors \\
        --max-steps 40 --eval-limit 1000 --metrics-json /tmp/torch.json

Both start from the same weights (loom's safetensors file, read here without the
safetensors package) and see the same batches in the same order (no shuffle, no
augmentation), so their losses agree step by step up to float rounding, which grows
slowly with the steps. It is the check that loom trains like PyTorch, not just that it
trains: a wrong gradient that still descends would show up here as a different curve.

Not part of the build or the test suite (Debian's python3-torch is optional).
"""
import argparse
import json
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN = (0.4914, 0.4822, 0.4465)  # the seed's normalisation, as train_cifar10
STD = (0.2023, 0.1994, 0.2010)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """The CIFAR variant train_cifar10 builds, with torchvision's names."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin, layers = 64, []
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def read_safetensors(path):
    """name -> tensor, from the format's definition: u64 header length, JSON, raw data."""
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(blob[base + begin : base + end], dtype=dtypes[info["dtype"]])
        out[name] = torch.from_numpy(array.reshape(info["shape"]).copy())
    return out


def read_cifar(root, train):
    """Images (N,3,32,32) uint8 and labels, from the official binary batches."""
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    records = np.concatenate([np.fromfile(os.path.join(root, n), dtype=np.uint8).reshape(-1, 3073) for n in names])
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].astype(np.int64)


def normalise(images):
    x = torch.from_numpy(images).float().div_(255)
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("LOOM_DATA", "../shared/data/cifar-10-batches-bin"))
    p.add_argument("--init", required=True, help="safetensors weights saved by train_cifar10 --save")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-limit", type=int, default=-1)
    p.add_argument("--metrics-json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    model = ResNet18()
    model.load_state_dict(read_safetensors(a.init), strict=True)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    images, labels = read_cifar(a.data, train=True)

    model.train()
    loss_sum = correct = seen = 0
    start = time.time()
    for step in range(a.max_steps):
        lo, hi = step * a.batch_size, (step + 1) * a.batch_size
        x, y = normalise(images[lo:hi]), torch.from_numpy(labels[lo:hi])
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_sum += loss.item() * len(y)
        correct += (logits.argmax(1) == y).sum().item()
        seen += len(y)
        print(f"step {step + 1:4d}  loss {loss.item():.4f}", flush=True)
    elapsed = time.time() - start

    test_images, test_labels = read_cifar(a.data, train=False)
    n = len(test_labels) if a.eval_limit < 0 else min(a.eval_limit, len(test_labels))
    model.eval()
    test_loss = test_correct = 0.0
    with torch.no_grad():
        for lo in range(0, n, 256):
            hi = min(lo + 256, n)
            logits = model(normalise(test_images[lo:hi]))
            y = torch.from_numpy(test_labels[lo:hi])
            test_loss += F.cross_entropy(logits, y, reduction="sum").item()
            test_correct += (logits.argmax(1) == y).sum().item()
    metrics = {
        "train_loss": loss_sum / max(seen, 1), "train_acc": correct / max(seen, 1),
        "test_loss": test_loss / n, "test_acc": test_correct / n,
        "img_per_s": seen / elapsed, "steps": a.max_steps,
    }
    print(json.dumps(metrics))
    if a.metrics_json:
        with open(a.metrics_json, "w") as f:
            json.dump(metrics, f)


if __name__ == "__main__":
    main()
