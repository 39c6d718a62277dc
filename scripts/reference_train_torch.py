#!/usr/bin/env python3
"""PyTorch reference for train_cifar10: the same model, data order and update rule.

ResNet18 with SGD (the trainer's defaults):

    build/examples/train_cifar10 --max-steps 0 --save /tmp/init.safetensors
    build/examples/train_cifar10 --init /tmp/init.safetensors --no-shuffle --no-augment \\
        --max-steps 40 --eval-limit 1000 --metrics-json /tmp/loom.json
    /usr/bin/python3 scripts/reference_train_torch.py --init /tmp/init.safetensors \\
        --max-steps 40 --eval-limit 1000 --metrics-json /tmp/torch.json

ViT-tiny with docs/transformer.md's recipe (AdamW, warm-up then cosine, clipping) over two
epochs, a test pass after each; --warmup-epochs 0.2 keeps the recipe's tenth of the run
(its 1 of 10 epochs) as warm-up:

    build/examples/train_cifar10 --model vit_tiny --max-steps 0 --save /tmp/vit_init.safetensors
    build/examples/train_cifar10 --model vit_tiny --init /tmp/vit_init.safetensors --no-shuffle \\
        --no-augment --epochs 2 --optimizer adamw --lr 1e-3 --weight-decay 0.05 \\
        --schedule warmup_cosine --warmup-epochs 0.2 --clip-grad-norm 1 --metrics-json /tmp/loom_vit.json
    /usr/bin/python3 scripts/reference_train_torch.py --model vit_tiny --init /tmp/vit_init.safetensors \\
        --epochs 2 --optimizer adamw --lr 1e-3 --weight-decay 0.05 \\
        --schedule warmup_cosine --warmup-epochs 0.2 --clip-grad-norm 1 --metrics-json /tmp/torch_vit.json

Both start from the same weights (loom's safetensors file, read here without the
safetensors package) and see the same batches in the same order (no shuffle, no
augmentation; every epoch walks the training set from the start, the last batch the 80
images left over, as loom's DataLoader without drop_last), so their losses agree step by
step up to float rounding, which grows slowly with the steps. It is the check that loom
trains like PyTorch, not just that it trains: a wrong gradient that still descends would
show up here as a different curve.

The flags mean what train_cifar10's do (train/trainer.cpp): the schedule spans
--epochs and is stepped after every optimizer step, --max-steps only stops early; the step
is forward, loss, zero_grad, backward, clip_grad_norm_, optimizer step. --metrics-json
writes train_cifar10's keys for the last epoch, and "per_epoch", a record per epoch.

Not part of the build or the test suite (Debian's python3-torch is optional).
"""
import argparse
import json
import math
import os
import re
import struct
import sys
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


def loom_vit_to_torch(state):
    """loom's ViT state_dict in nn.MultiheadAttention's names: each block's separate
    self_attn.q_proj, k_proj and v_proj packed, in that order, into in_proj_weight [3D, D]
    and in_proj_bias [3D] (nn::mha_state_dict_to_pytorch, as bench/vit_parity.cpp saves
    them). Every other name (out_proj, linear1/2, norm1/2, patch_embed, cls_token,
    pos_embed, norm, head) is PyTorch's already."""
    out = {}
    for name, tensor in state.items():
        m = re.fullmatch(r"(.*\.self_attn\.)([qkv])_proj\.(weight|bias)", name)
        if m is None:
            out[name] = tensor
        elif m.group(2) == "q":
            prefix, kind = m.group(1), m.group(3)
            out[f"{prefix}in_proj_{kind}"] = torch.cat([state[f"{prefix}{x}_proj.{kind}"] for x in "qkv"])
    return out


def build_model(name, init):
    """The model with --init's weights, every key and shape checked (strict)."""
    state = read_safetensors(init)
    if name == "resnet18":
        model = ResNet18()
    else:
        # Imported here: bench/parity.py, which vit_parity_torch imports, imports this file.
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
        from vit_parity_torch import CONFIGS, VisionTransformer  # loom's ViT of nn.TransformerEncoderLayer blocks
        model, state = VisionTransformer(*CONFIGS[name]), loom_vit_to_torch(state)
    model.load_state_dict(state, strict=True)
    return model


def adamw_param_groups(model, weight_decay, no_weight_decay):
    """nn/optim/adamw.h's param_groups_weight_decay (timm's): no decay on tensors of one dim
    or none (biases, norms), on names ending in ".bias", and on `no_weight_decay` (a ViT's
    cls_token and pos_embed, VisionTransformer::no_weight_decay); decay on the rest."""
    no_decay, decay = [], []
    for name, p in model.named_parameters():
        exempt = p.dim() <= 1 or name.endswith(".bias") or name in no_weight_decay
        (no_decay if exempt else decay).append(p)
    groups = [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]
    return [g for g in groups if g["params"]]


def build_optimizer(a, model):
    """train/optimizer.cpp's build_optimizer: SGD over every parameter, or AdamW
    (PyTorch's betas 0.9, 0.999 and eps 1e-8, loom's defaults too) over the two groups."""
    if a.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay,
                               nesterov=a.nesterov)
    exempt = {"cls_token", "pos_embed"} if a.model.startswith("vit") else set()
    return torch.optim.AdamW(adamw_param_groups(model, a.weight_decay, exempt), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)


def lr_at(a, step, steps_per_epoch):
    """The lr of optimizer step `step` (0 first), as trainer.cpp's make_scheduler: the
    schedule spans --epochs (not --max-steps) and is stepped after every optimizer step;
    the closed forms of nn/optim/lr_scheduler.cpp, in its order of operations.
    warmup_cosine: SequentialLR of LinearLR(start_factor 1/W, 1, W) for the first
    W = int(warmup_epochs * steps_per_epoch) steps, then CosineAnnealingLR(T - W) to 0."""
    total = max(steps_per_epoch * a.epochs, 1)
    if a.schedule == "none":
        return a.lr
    if a.schedule == "cosine":
        return a.lr * (1 + math.cos(math.pi * step / total)) / 2
    warmup = int(a.warmup_epochs * steps_per_epoch)
    if not 1 <= warmup < total:
        sys.exit(f"--schedule warmup_cosine: --warmup-epochs {a.warmup_epochs} gives {warmup} warm-up steps of the "
                 f"run's {total}; it needs at least 1 and fewer than all")
    if step < warmup:
        start, t = 1.0 / warmup, min(step, warmup) / warmup
        return a.lr * (start + (1.0 - start) * t)
    return a.lr * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


def read_cifar(root, train):
    """Images (N,3,32,32) uint8 and labels, from the official binary batches."""
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    records = np.concatenate([np.fromfile(os.path.join(root, n), dtype=np.uint8).reshape(-1, 3073) for n in names])
    return records[:, 1:].reshape(-1, 3, 32, 32), records[:, 0].astype(np.int64)


def normalise(images):
    x = torch.from_numpy(images).float().div_(255)
    return (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def evaluate(model, images, labels, n, label_smoothing):
    """Loss and accuracy on the first n test images, in batches of 256, with the training
    criterion (loom's evaluation uses it too, label smoothing included)."""
    model.eval()
    loss_sum = correct = 0.0
    with torch.no_grad():
        for lo in range(0, n, 256):
            hi = min(lo + 256, n)
            logits = model(normalise(images[lo:hi]))
            y = torch.from_numpy(labels[lo:hi])
            loss_sum += F.cross_entropy(logits, y, label_smoothing=label_smoothing).item() * (hi - lo)
            correct += (logits.argmax(1) == y).sum().item()
    model.train()
    return loss_sum / max(n, 1), correct / max(n, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("LOOM_DATA", "../shared/data/cifar-10-batches-bin"))
    p.add_argument("--init", required=True, help="safetensors weights saved by train_cifar10 --save")
    p.add_argument("--model", default="resnet18", choices=["resnet18", "vit_tiny", "vit_small"])
    p.add_argument("--epochs", type=int, default=3, help="passes over the training set (the schedule's length)")
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps (-1: no limit)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9, help="SGD")
    p.add_argument("--nesterov", action="store_true", help="SGD")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="L2 penalty (AdamW: decoupled decay)")
    p.add_argument("--schedule", default="none", choices=["none", "cosine", "warmup_cosine"])
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="warmup_cosine: epochs of linear warm-up")
    p.add_argument("--clip-grad-norm", type=float, default=0.0, help="clip the gradients' 2-norm to this; 0: no")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-limit", type=int, default=-1, help="evaluate on at most N test images (-1: all)")
    p.add_argument("--metrics-json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    model = build_model(a.model, a.init)
    opt = build_optimizer(a, model)
    images, labels = read_cifar(a.data, train=True)
    test_images, test_labels = read_cifar(a.data, train=False)
    n_test = len(test_labels) if a.eval_limit < 0 else min(a.eval_limit, len(test_labels))
    steps_per_epoch = math.ceil(len(labels) / a.batch_size)  # the last batch is what is left (no drop_last)

    model.train()
    step, step_seconds, timed_images, per_epoch = 0, [], 0, []
    for epoch in range(a.epochs):
        if 0 <= a.max_steps <= step:
            break
        loss_sum = correct = seen = 0.0
        epoch_start = time.time()
        for lo in range(0, len(labels), a.batch_size):
            if 0 <= a.max_steps <= step:
                break
            x, y = normalise(images[lo : lo + a.batch_size]), torch.from_numpy(labels[lo : lo + a.batch_size])
            start = time.time()
            lr = lr_at(a, step, steps_per_epoch)
            for group in opt.param_groups:
                group["lr"] = lr
            logits = model(x)
            loss = F.cross_entropy(logits, y, label_smoothing=a.label_smoothing)
            opt.zero_grad()
            loss.backward()
            if a.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_grad_norm)
            opt.step()
            step += 1
            if step > 1:  # as train_cifar10, the first step (warming caches) is not timed
                step_seconds.append(time.time() - start)
                timed_images += len(y)
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
            print(f"step {step:5d}  loss {loss.item():.6f}  lr {lr:.6g}", flush=True)
        seconds = time.time() - epoch_start
        test_loss, test_acc = evaluate(model, test_images, test_labels, n_test, a.label_smoothing)
        record = {"epoch": epoch + 1, "train_loss": loss_sum / max(seen, 1), "train_acc": correct / max(seen, 1),
                  "test_loss": test_loss, "test_acc": test_acc, "seconds": seconds}
        per_epoch.append(record)
        tested = f"test loss {test_loss:.4f}  test acc {100 * test_acc:.2f}%" if n_test else "no test images"
        print(f"epoch {epoch + 1}/{a.epochs}  train loss {record['train_loss']:.4f}  train acc "
              f"{100 * record['train_acc']:.2f}%  {tested}  time {seconds:.1f}s  {seen / max(seconds, 1e-9):.1f} img/s",
              flush=True)

    last = per_epoch[-1] if per_epoch else {"train_loss": 0, "train_acc": 0, "test_loss": 0, "test_acc": 0}
    metrics = {  # train_cifar10's --metrics-json keys (the last epoch's), and every epoch's
        "train_loss": last["train_loss"], "train_acc": last["train_acc"],
        "test_loss": last["test_loss"], "test_acc": last["test_acc"], "test_images": n_test,
        "img_per_s": timed_images / sum(step_seconds) if step_seconds else 0.0,
        "median_step_s": float(np.median(step_seconds)) if step_seconds else 0.0,
        "steps": step, "epochs": sum(1 for r in per_epoch if r["epoch"] * steps_per_epoch <= step),
        "per_epoch": per_epoch,
    }
    print(json.dumps({k: v for k, v in metrics.items() if k != "per_epoch"}))
    if a.metrics_json:
        with open(a.metrics_json, "w") as f:
            json.dump(metrics, f, indent=1)


if __name__ == "__main__":
    main()
