#!/usr/bin/env python3
"""One epoch of the ResNet18 recipe in each parallel mode, and in PyTorch, from the same init:
do the modes train the same model, within the noise of two seeds?

    python3 bench/resnet18_modes.py WORK_DIR [--data DIR] [--out bench/results/resnet18_modes.json]

Every row trains recipes/resnet18_94.toml for one epoch (its one-cycle schedule compressed into
that epoch: 98 steps of a global batch of 512) from one init file, written first by
`train_cifar10 --max-steps 0 --save`, and reports the one-view test accuracy:

  one process                  --batch-size 512 --threads 2             (seed 0, and seed 1: the noise)
  DataParallel, 2 devices      --mode dp --dp-devices 2                 (one process)
  1F1B pipeline, 2 stages      --mode pipeline --mp-devices 2 --pipeline-schedule 1f1b (one process)
  FSDP                         --dp-shard 2, 2 processes under loomrun, 256 images each
  pipeline x FSDP              --pp 2 --dp-shard 2, 4 processes under loomrun
  PyTorch 1.13                 the same recipe written in torch (this file's torch_epoch), same init

Lookahead (--lookahead-every) is off in every row: it averages each rank's whole model, which a
pipeline stage or an FSDP shard does not hold (docs/limitations.md). The seed changes the data
order and the augmentations, not the init. The modes share the seed-0 order; a rank's share
of a step differs between one process and 2 ranks (DistributedSampler interleaves), and BatchNorm
sees per-rank batches, so none is expected bitwise equal to another: the question is whether
their accuracies differ by more than two seeds do.

Each row's output is kept in WORK_DIR (a folder of its own, outside the repository); a row
whose metrics file is there is not run again, so an interrupted invocation resumes where it
stopped. --quick trains 2 steps per row and evaluates 200 images (a check of the plumbing).
"""
import argparse
import json
import os
import shlex
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
from airbench_torch import FILES, find_data  # noqa: E402  (imports no torch)

COMMON = ["--recipe", "resnet18_94", "--epochs", "1", "--lookahead-every", "0", "--quiet", "--workers", "2"]
# (row key, title, processes, flags). The recipe's --batch-size 256 is per process.
ROWS = [
    ("single", "one process", 1, ["--batch-size", "512", "--threads", "2"]),
    ("single_seed1", "one process, seed 1", 1, ["--batch-size", "512", "--threads", "2", "--seed", "1"]),
    ("dp", "DataParallel, 2 devices", 1, ["--mode", "dp", "--dp-devices", "2", "--batch-size", "512", "--threads", "2"]),
    ("pipeline", "1F1B pipeline, 2 stages", 1, ["--mode", "pipeline", "--mp-devices", "2", "--pipeline-schedule", "1f1b",
                                               "--batch-size", "512", "--threads", "2"]),
    ("fsdp", "FSDP (`--dp-shard 2`), 2 processes", 2, ["--dp-shard", "2", "--threads", "1"]),
    ("pp_fsdp", "`--pp 2 --dp-shard 2`, 4 processes", 4, ["--pp", "2", "--dp-shard", "2", "--threads", "1"]),
]

# What loom's trainer does with the recipe's flags, written for torch (train/loaders.cpp's
# normalisation, data/transforms.h's RandomCrop and alternating flip, train/optimizer.cpp).
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
BATCH, LR, MOMENTUM, WEIGHT_DECAY, LABEL_SMOOTHING, PADDING = 512, 0.4, 0.9, 5e-4, 0.1, 4


def read_safetensors(path):
    """{name: torch tensor} of a safetensors file (little-endian, as loom writes it)."""
    import numpy as np
    import torch
    dtypes = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[begin:end], dtype=dtypes[entry["dtype"]]).copy()
                                     .reshape(entry["shape"]))
    return out


def torch_epoch(init, data, threads, seed, max_steps, eval_limit):
    """One epoch of the recipe in PyTorch from `init`: {"test_acc", "train_loss", "test_loss", "steps", "wall_s"}."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from resnet_parity_torch import MODELS, ResNet

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    block, layers, width = MODELS["resnet18"]
    net = ResNet(block, layers, 10, width, imagenet_stem=False)
    own = net.state_dict()
    state = {k: v.to(own[k].dtype) for k, v in read_safetensors(init).items()}
    net.load_state_dict(state, strict=True)
    net = net.to(memory_format=torch.channels_last)

    def read(names):
        raw = np.concatenate([np.fromfile(os.path.join(data, n), dtype=np.uint8).reshape(-1, 3073) for n in names])
        images = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32)).float().div_(255)
        images.sub_(torch.tensor(MEAN).view(1, 3, 1, 1)).div_(torch.tensor(STD).view(1, 3, 1, 1))
        return images, torch.from_numpy(raw[:, 0].astype(np.int64))
    train_x, train_y = read(FILES[:5])
    test_x, test_y = read(FILES[5:])
    if eval_limit >= 0:
        test_x, test_y = test_x[:eval_limit], test_y[:eval_limit]

    decay = [p for p in net.parameters() if p.ndim > 1]          # no decay on BatchNorm and biases
    no_decay = [p for p in net.parameters() if p.ndim <= 1]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=LR, momentum=MOMENTUM, nesterov=True)
    steps = (len(train_x) + BATCH - 1) // BATCH                   # the last batch is smaller, as loom's loader
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=steps)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)
    g = torch.Generator().manual_seed(seed)
    coins = torch.rand(len(train_x), generator=g) < 0.5           # alternating flip: epoch 0 takes the coins
    order = torch.randperm(len(train_x), generator=g)
    losses, started = [], time.time()
    net.train()
    for step, idx in enumerate(order.split(BATCH)):
        if 0 <= max_steps <= step:
            break
        padded = F.pad(train_x[idx], (PADDING,) * 4, mode="reflect")
        offsets = torch.randint(0, 2 * PADDING + 1, (len(idx), 2), generator=g)
        x = torch.stack([p[:, r:r + 32, c:c + 32] for p, (r, c) in zip(padded, offsets.tolist())])
        flip = coins[idx]
        x[flip] = x[flip].flip(-1)
        loss = criterion(net(x.contiguous(memory_format=torch.channels_last)), train_y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    wall = time.time() - started
    net.eval()
    correct, total_loss = 0, 0.0
    with torch.no_grad():
        for x, y in zip(test_x.split(1000), test_y.split(1000)):
            logits = net(x.contiguous(memory_format=torch.channels_last))
            correct += (logits.argmax(1) == y).sum().item()
            total_loss += F.cross_entropy(logits, y, reduction="sum").item()
    n = max(len(test_y), 1)
    return {"test_acc": 100.0 * correct / n, "test_loss": total_loss / n, "train_loss": sum(losses) / len(losses),
            "steps": len(losses), "train_s": wall, "img_per_s": min(len(losses) * BATCH, len(train_x)) / wall}


def loom_command(build, processes, flags, data, init, metrics):
    cmd = [os.path.join(build, "examples", "train_cifar10"), *COMMON, *flags, "--init", init, "--data", data,
           "--metrics-json", metrics]
    if processes > 1:
        cmd = [os.path.join(build, "parallel", "loomrun"), "--standalone", "--nproc_per_node", str(processes), *cmd]
    return cmd


def run_row(key, command, work):
    """Runs `command` once (skipped when WORK_DIR already holds its metrics); returns the metrics."""
    metrics = os.path.join(work, f"{key}.json")
    if os.path.exists(metrics):
        print(f"{key}: done before ({metrics})", flush=True)
        with open(metrics) as f:
            return json.load(f)
    print(f"{key}: {shlex.join(command)}", flush=True)
    started = time.time()
    with open(os.path.join(work, f"{key}.log"), "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, OMP_NUM_THREADS="1" if "loomrun" in command[0] else "2"))
    if done.returncode != 0:
        sys.exit(f"{key} failed (rc {done.returncode}); its output is in {work}/{key}.log")
    return finish(metrics, time.time() - started)


def finish(metrics, wall):
    """The row's metrics file, with the wall time of its process added (atomically)."""
    with open(metrics) as f:
        doc = json.load(f)
    doc["wall_s"] = wall  # the whole process: start-up, data, training and evaluation
    with open(metrics + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(metrics + ".tmp", metrics)
    return doc


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="a folder of its own for the rows' logs and metrics (outside the repository)")
    p.add_argument("--data", help="CIFAR-10's binary folder (else $LOOM_DATA, data/)")
    p.add_argument("--build", default=os.path.join(results_file.ROOT, "build"))
    p.add_argument("--out", default=os.path.join(results_file.ROOT, "bench", "results", "resnet18_modes.json"))
    p.add_argument("--torch-python", default="/usr/bin/python3", help="a python with torch (Debian's python3-torch)")
    p.add_argument("--quick", action="store_true", help="2 steps per row, 200 test images: the plumbing only")
    p.add_argument("--torch-row", action="store_true", help=argparse.SUPPRESS)  # the PyTorch row's own process
    a = p.parse_args()
    data = find_data(a.data)
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    init = os.path.join(work, "init.safetensors")
    limit = ["--max-steps", "2", "--eval-limit", "200"] if a.quick else []
    if a.torch_row:
        doc = torch_epoch(init, data, threads=2, seed=0, max_steps=2 if a.quick else -1, eval_limit=200 if a.quick else -1)
        with open(os.path.join(work, "torch.json.tmp"), "w") as f:
            json.dump(doc, f)
        os.replace(os.path.join(work, "torch.json.tmp"), os.path.join(work, "torch.json"))
        return

    started = results_file.now()
    if not os.path.exists(init):
        subprocess.run([os.path.join(a.build, "examples", "train_cifar10"), "--model", "resnet18", "--synthetic",
                        "--max-steps", "0", "--eval-limit", "0", "--seed", "0", "--quiet", "--save", init],
                       check=True, stdout=subprocess.DEVNULL)
    rows, by_key = [], {}
    for key, title, processes, flags in ROWS:
        m = run_row(key, loom_command(a.build, processes, flags + limit, data, init, os.path.join(work, f"{key}.json")),
                    work)
        by_key[key] = m
        rows.append({"run": title, "framework": "loom", "flags": " ".join(flags), "processes": processes,
                     "test_acc": 100.0 * m["test_acc"], "train_loss": m["train_loss"], "test_loss": m["test_loss"],
                     "steps": m["steps"], "wall_s": m["wall_s"]})
    t = run_row("torch", [a.torch_python, os.path.abspath(__file__), work, "--data", data, "--torch-row"]
                + (["--quick"] if a.quick else []), work)
    rows.append({"run": "PyTorch 1.13, the same recipe", "framework": "torch", "flags": "bench/resnet18_modes.py",
                 "processes": 1, "test_acc": t["test_acc"], "train_loss": t["train_loss"], "test_loss": t["test_loss"],
                 "steps": t["steps"], "wall_s": t["wall_s"]})
    reference = rows[0]["test_acc"]
    for row in rows:
        row["vs_one_process"] = row["test_acc"] - reference
    noise = abs(rows[1]["test_acc"] - reference)
    columns = [{"key": "run", "title": "run"}, {"key": "processes", "title": "processes"},
               {"key": "test_acc", "title": "test acc % (one view)", "format": ".2f"},
               {"key": "vs_one_process", "title": "vs one process (points)", "format": "+.2f"},
               {"key": "train_loss", "title": "train loss", "format": ".3f"},
               {"key": "test_loss", "title": "test loss", "format": ".3f"},
               {"key": "wall_s", "title": "wall s", "format": ".0f"}]
    conditions = (f"One epoch (98 steps, global batch 512) of recipes/resnet18_94.toml without Lookahead, from one init; "
                  f"seed 0 except the noise row. Two seeds in one process differ by {noise:.2f} points: the noise "
                  f"the other rows are set against. Wall times are on {os.cpu_count()} cores shared with other work, "
                  f"not a speed comparison (docs/benchmarks.md has those).")
    if a.quick:
        conditions = "--quick: 2 steps per row, 200 test images (the plumbing, not a result). " + conditions
    doc = results_file.document("ResNet18, one epoch of its recipe in each parallel mode and in PyTorch",
                                "resnet18_modes.py", columns, rows, [], started, conditions)
    doc["noise_points"] = noise
    results_file.write(a.out, doc)
    width = max(len(r["run"]) for r in rows)
    for r in rows:
        print(f"{r['run']:<{width}}  {r['test_acc']:6.2f}%  ({r['vs_one_process']:+.2f})  train loss {r['train_loss']:.3f}")
    print(f"noise (two seeds, one process): {noise:.2f} points")


if __name__ == "__main__":
    main()
