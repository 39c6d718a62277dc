#!/usr/bin/env python3
"""The airbench94 CIFAR-10 recipe in plain PyTorch 1.13 on the CPU (float32, eager): the
reference that loom's build/examples/airbench is timed against (bench/time_to_accuracy.py).

    /usr/bin/python3 bench/airbench_torch.py --seed 0 --threads 2 --metrics-json /tmp/torch_s0.json
    /usr/bin/python3 bench/airbench_torch.py --steps 10 --threads 2 --eval-limit 2000 --self-check

The recipe (Keller Jordan's airbench94):
  data      the six binary files read with numpy, pixels / 255, normalised by the CIFAR-10
            mean (0.4914, 0.4822, 0.4465) and std (0.2470, 0.2435, 0.2616); the training set
            is one float tensor in memory. Reading and normalising are not timed.
  network   2x2 conv 3->24 (with bias, no padding: 32->31) -> GELU; three blocks of widths
            64, 256, 256, each conv3x3 -> MaxPool2d(2) -> BN -> GELU -> conv3x3 -> BN -> GELU
            (31->15->7->3); MaxPool2d(3) -> flatten -> Linear(256->10, no bias) -> x 1/9.
            Each 3x3 conv (padding 1, no bias) has PyTorch's default init and then the
            identity (nn.init.dirac_) on its first C_in filters. BatchNorm: eps 1e-12,
            momentum 0.4, weight frozen at 1 (only the bias trains).
  whitening the first conv's 24 filters are the eigenvectors of the second moment X^T X / n
            of every 2x2 patch of the first 5,000 training images, scaled by
            1 / sqrt(eigenvalue + 5e-4), in decreasing eigenvalue order, then their
            negatives (Note [Whitening filters] in nn/whitening.h). The weight is frozen; the
            bias starts at zero and trains for the first 3 epochs (144 steps) only.
  training  SGD, Nesterov momentum 0.85, batch 1024 (48 full batches an epoch, the rest
            dropped), 476 steps (9.9 epochs); loss = cross-entropy with label smoothing 0.2,
            summed over the batch. lr = 11.5 / (1024 (1 + 1/(1 - 0.85))), BN biases at 64 x lr;
            weight decay such that lr x wd = 0.0153 / (1 + 1/(1 - 0.85)) in every group. The
            lr factor runs linearly through 0.2, 1.0, 0.07 at steps 0, 0.23 x 476, 476
            (LambdaLR, stepped after every step).
  lookahead every 5 steps, average = lerp(average, model, 1 - decay) over every floating
            state_dict entry (BN statistics too), decay = 0.95^5 (step / 476)^3, and the
            model takes the average; after the last step the model takes the average.
  augment   a random mirror per image at epoch 0 kept as the base, the whole base mirrored
            on odd epochs; a random translation by -2..2 pixels on each axis (reflect padding
            2, 32x32 crop), drawn per image per epoch; a fresh order every epoch.
  test      six views (mirrored or not x no shift, shift (-1,-1), shift (+1,+1) from
            reflect padding 1), logits = 0.5 unshifted + 0.25 each shifted pair, each pair
            the mean of the image and its mirror; accuracy on the 10,000 test images.

The timed wall clock covers the whitening, the training and the final test-time-augmented
evaluation; --eval-every-epoch's evaluations and the plain (one-view) accuracy reported
beside it are outside it. PyTorch runs with glibc's malloc tuned (GLIBC_TUNABLES, as
bench_train's "torch tuned": the script starts itself again with it set) unless --no-tune,
and under Debian's /usr/bin/python3 (python3-torch) when the running python has no torch.
--metrics-json writes the keys loom's airbench writes, so bench/time_to_accuracy.py reads both.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

TUNED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"
DEBIAN_PYTHON = "/usr/bin/python3"
FILES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)

BATCH = 1024
EPOCHS = 9.9
STEPS_PER_EPOCH = 50000 // BATCH                       # 48: drop_last
TOTAL_STEPS = math.ceil(STEPS_PER_EPOCH * EPOCHS)      # 476
MOMENTUM = 0.85
KILL = 1 + 1 / (1 - MOMENTUM)                          # the lr scale of Nesterov momentum 0.85
LR = 11.5 / (BATCH * KILL)                             # ~1.465e-3
WD_TOTAL = 0.0153 * BATCH / (BATCH * KILL)             # lr x weight decay, ~2e-3
BN_LR_SCALE = 64
WHITEN_BIAS_STEPS = 3 * STEPS_PER_EPOCH                # 144
WHITEN_IMAGES = 5000
WHITEN_EPS = 5e-4
LABEL_SMOOTHING = 0.2
TTA_BATCH = 2000


def find_data(flag=None):
    """The folder with the six .bin files, searched as loom's data/data_root.h does: --data,
    then $LOOM_DATA (the folder itself or a parent holding cifar-10-batches-bin/), then
    data/cifar-10-batches-bin and ../shared/data/cifar-10-batches-bin from the current
    directory and from the repository."""
    def holds(folder):
        return all(os.path.isfile(os.path.join(folder, f)) for f in FILES)

    for given in (flag, os.environ.get("LOOM_DATA")):
        if given:
            for folder in (given, os.path.join(given, "cifar-10-batches-bin")):
                if holds(folder):
                    return os.path.abspath(folder)
            sys.exit(f"airbench_torch: {given} holds no CIFAR-10 binary files ({', '.join(FILES)})")
    for base in (os.getcwd(), ROOT):
        for rel in ("data/cifar-10-batches-bin", "../shared/data/cifar-10-batches-bin"):
            if holds(os.path.join(base, rel)):
                return os.path.abspath(os.path.join(base, rel))
    sys.exit("airbench_torch: CIFAR-10 not found: pass --data DIR or set LOOM_DATA "
             "(scripts/get_cifar10.sh downloads it)")


def restart_if_needed(args):
    """Start again under glibc's tuned malloc (it is read at process start) and under a
    python that has torch; returns when neither is needed."""
    env = dict(os.environ)
    python = sys.executable
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.path.realpath(python) == os.path.realpath(DEBIAN_PYTHON) or not os.path.exists(DEBIAN_PYTHON):
            sys.exit("airbench_torch: needs PyTorch; install it (Debian: apt-get install python3-torch)")
        python = DEBIAN_PYTHON
    if not args.no_tune and env.get("GLIBC_TUNABLES") != TUNED:
        env["GLIBC_TUNABLES"] = TUNED
    if python != sys.executable or env != os.environ:
        sys.stdout.flush()
        os.execve(python, [python, os.path.abspath(__file__)] + sys.argv[1:], env)


# ---------------------------------------------------------------------------------------- data

def load_cifar10(folder):
    """(train images [50000, 3, 32, 32], train labels, test images, test labels) as float32
    normalised tensors and int64 labels."""
    import numpy as np
    import torch

    def read(names):
        raw = np.concatenate([np.fromfile(os.path.join(folder, n), dtype=np.uint8).reshape(-1, 3073) for n in names])
        labels = torch.from_numpy(raw[:, 0].astype(np.int64))
        images = torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32)).float().div_(255)  # in place: one copy
        mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
        return images.sub_(mean).div_(std), labels

    return (*read(FILES[:5]), *read(FILES[5:]))


def crop(padded, offsets):
    """Each image's 32x32 window of `padded` ([B, C, 36, 36]) at (offsets[:, 0], offsets[:, 1])
    (rows, columns, 0..4): rows first, then columns, one slice per offset value."""
    import torch
    size = padded.size(-1) - 4
    rows = torch.empty(*padded.shape[:2], size, padded.size(-1), dtype=padded.dtype)
    for d in range(5):
        pick = offsets[:, 0] == d
        if pick.any():
            rows[pick] = padded[pick, :, d:d + size, :]
    out = torch.empty(*padded.shape[:2], size, size, dtype=padded.dtype)
    for d in range(5):
        pick = offsets[:, 1] == d
        if pick.any():
            out[pick] = rows[pick, :, :, d:d + size]
    return out


# ------------------------------------------------------------------------------------- network

def build_net():
    import torch
    from torch import nn

    def conv3x3(c_in, c_out):
        conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        with torch.no_grad():
            nn.init.dirac_(conv.weight[:c_in])
        return conv

    def norm(c):
        bn = nn.BatchNorm2d(c, eps=1e-12, momentum=0.4)
        bn.weight.requires_grad_(False)
        return bn

    class Block(nn.Module):
        def __init__(self, c_in, c_out):
            super().__init__()
            self.conv1, self.pool, self.norm1 = conv3x3(c_in, c_out), nn.MaxPool2d(2), norm(c_out)
            self.conv2, self.norm2, self.act = conv3x3(c_out, c_out), norm(c_out), nn.GELU()

        def forward(self, x):
            x = self.act(self.norm1(self.pool(self.conv1(x))))
            return self.act(self.norm2(self.conv2(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.whiten, self.act = nn.Conv2d(3, 24, 2, padding=0, bias=True), nn.GELU()
            self.block1, self.block2, self.block3 = Block(24, 64), Block(64, 256), Block(256, 256)
            self.pool, self.head = nn.MaxPool2d(3), nn.Linear(256, 10, bias=False)

        def forward(self, x):
            x = self.block3(self.block2(self.block1(self.act(self.whiten(x)))))
            return self.head(self.pool(x).flatten(1)) * (1 / 9)

    return Net()


def patches(images):
    """[N * 31 * 31, 12] float64: every 2x2 patch (stride 1), each as (c, h, w)."""
    n, c = images.shape[:2]
    p = images.double().unfold(2, 2, 1).unfold(3, 2, 1)          # [N, C, 31, 31, 2, 2]
    return p.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * 4)


def whitening_filters(images, eps=WHITEN_EPS):
    """(filters [24, 3, 2, 2] float32, eigenvalues descending) of Note [Whitening filters]."""
    import torch
    moment = torch.zeros(12, 12, dtype=torch.float64)
    count = 0
    for chunk in images.split(1000):
        x = patches(chunk)
        moment += x.T @ x
        count += x.size(0)
    values, vectors = torch.linalg.eigh(moment / count)         # ascending
    values, vectors = values.flip(0), vectors.flip(1)
    filters = (vectors.T / torch.sqrt(values + eps)[:, None]).reshape(12, 3, 2, 2)
    return torch.cat([filters, -filters]).float(), values


def self_check(net, images, values):
    """The whitened patches' second moment is diag(l / (l + eps)): uncorrelated, and unit
    variance along every component whose eigenvalue l is well above eps (the few pixel-noise
    components near eps are damped on purpose, Note [Whitening filters])."""
    import torch
    with torch.no_grad():
        out = torch.nn.functional.conv2d(images, net.whiten.weight[:12])  # no bias
        flat = out.double().permute(0, 2, 3, 1).reshape(-1, 12)
        moment = flat.T @ flat / flat.size(0)
    diagonal = torch.diagonal(moment)
    off = (moment - torch.diag(diagonal)).abs().max().item()
    err = (diagonal - values / (values + WHITEN_EPS)).abs().max().item()
    strong = values > 20 * WHITEN_EPS
    unit = (diagonal[strong] - 1).abs().max().item()
    print(f"self-check: whitened 2x2 patches of {images.size(0)} images: second moment off-diagonal max {off:.1e}; "
          f"diagonal {' '.join(f'{d:.3f}' for d in diagonal.tolist())} (l/(l+eps) to {err:.1e}); "
          f"the {int(strong.sum())} components with l > 20 eps within {unit:.3f} of 1; "
          f"eigenvalues {values[0].item():.3g}..{values[-1].item():.3g}", flush=True)
    assert off < 1e-3 and err < 1e-3, f"whitening does not whiten: off-diagonal {off}, diagonal error {err}"
    assert strong.sum() >= 6 and unit < 0.05, f"whitened components not at unit variance: {unit}"


class Lookahead:
    """A copy of every floating state_dict entry; update(decay) pulls it towards the model by
    1 - decay and writes it back into the model (integer entries keep the model's value)."""

    def __init__(self, net):
        self.live = [t for t in net.state_dict().values() if t.is_floating_point()]
        self.average = [t.clone() for t in self.live]

    def update(self, decay):
        import torch
        with torch.no_grad():
            for average, live in zip(self.average, self.live):
                average.lerp_(live, 1 - decay)
                live.copy_(average)


def evaluate(net, images, labels, tta, channels_last):
    """Accuracy (fraction) in eval mode: one view, or the six views of test-time augmentation."""
    import torch
    import torch.nn.functional as F
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    was_training = net.training
    net.eval()
    correct = 0
    with torch.no_grad():
        for x, y in zip(images.split(TTA_BATCH), labels.split(TTA_BATCH)):
            def pair(v):
                v = v.contiguous(memory_format=fmt)
                return 0.5 * (net(v) + net(v.flip(-1)))
            if tta:
                padded = F.pad(x, (1, 1, 1, 1), mode="reflect")
                logits = 0.5 * pair(x) + 0.25 * pair(padded[..., 0:32, 0:32]) + 0.25 * pair(padded[..., 2:34, 2:34])
            else:
                logits = net(x.contiguous(memory_format=fmt))
            correct += (logits.argmax(1) == y).sum().item()
    net.train(was_training)
    return correct / labels.numel()


# -------------------------------------------------------------------------------------- train

def train(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn
    torch.set_num_threads(args.threads)  # Debian's build ignores OMP_NUM_THREADS
    torch.manual_seed(args.seed)
    steps = TOTAL_STEPS if args.steps is None else args.steps
    data = find_data(args.data)
    train_images, train_labels, test_images, test_labels = load_cifar10(data)
    if args.eval_limit is not None:
        test_images, test_labels = test_images[:args.eval_limit], test_labels[:args.eval_limit]
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    print(f"airbench94 in PyTorch {torch.__version__}: {steps} of {TOTAL_STEPS} steps, batch {BATCH}, "
          f"seed {args.seed}, {args.threads} threads, {'channels_last' if args.channels_last else 'NCHW'}, "
          f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}; data {data}", flush=True)

    net = build_net().to(memory_format=fmt)
    phases = dict.fromkeys(["whitening", "train", "data", "lookahead", "tta"], 0.0)
    untimed = 0.0
    start = time.perf_counter()

    # whitening
    t = time.perf_counter()
    filters, values = whitening_filters(train_images[:WHITEN_IMAGES])
    with torch.no_grad():
        net.whiten.weight.copy_(filters)
        net.whiten.bias.zero_()
    net.whiten.weight.requires_grad_(False)
    phases["whitening"] = time.perf_counter() - t
    if args.self_check:
        u = time.perf_counter()
        self_check(net, train_images[:WHITEN_IMAGES], values)
        untimed += time.perf_counter() - u

    # optimizer, schedule, lookahead
    train_start = time.perf_counter()
    norm_biases = [p for name, p in net.named_parameters() if "norm" in name and p.requires_grad]
    others = [p for name, p in net.named_parameters() if "norm" not in name and p.requires_grad]
    optimizer = torch.optim.SGD(
        [{"params": norm_biases, "lr": LR * BN_LR_SCALE, "weight_decay": WD_TOTAL / (LR * BN_LR_SCALE)},
         {"params": others, "lr": LR, "weight_decay": WD_TOTAL / LR}],
        momentum=MOMENTUM, nesterov=True)
    knots = ([0, 0.23 * TOTAL_STEPS, TOTAL_STEPS], [0.2, 1.0, 0.07])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: float(np.interp(step, *knots)))
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING, reduction="none")
    lookahead = Lookahead(net)

    n = train_images.size(0)
    done, per_epoch, loss_last, evaluations = 0, [], float("nan"), 0.0
    net.train()
    for epoch in range(math.ceil(steps / STEPS_PER_EPOCH)):
        t = time.perf_counter()
        if epoch == 0:  # the base: the training set mirrored at random, in place (the whitening has read it)
            mirror = torch.rand(n) < 0.5
            train_images[mirror] = train_images[mirror].flip(-1)
        offsets = torch.randint(0, 5, (n, 2))
        order = torch.randperm(n)
        phases["data"] += time.perf_counter() - t
        losses = []
        for b in range(STEPS_PER_EPOCH):
            if done == steps:
                break
            t = time.perf_counter()
            index = order[b * BATCH:(b + 1) * BATCH]
            x = crop(F.pad(train_images[index], (2, 2, 2, 2), mode="reflect"), offsets[index])
            if epoch % 2 == 1:
                x = x.flip(-1)
            x, y = x.contiguous(memory_format=fmt), train_labels[index]
            phases["data"] += time.perf_counter() - t
            step_start = time.perf_counter()
            net.whiten.bias.requires_grad_(done < WHITEN_BIAS_STEPS)
            loss = criterion(net(x), y).sum()
            optimizer.zero_grad(set_to_none=True)  # a frozen whitening bias keeps grad None: SGD skips it
            loss.backward()
            optimizer.step()
            scheduler.step()
            done += 1
            if done % 5 == 0:
                t = time.perf_counter()
                lookahead.update(0.95 ** 5 * (done / TOTAL_STEPS) ** 3)
                phases["lookahead"] += time.perf_counter() - t
            loss_last = loss.item() / BATCH
            losses.append(loss_last)
            if args.log_every and (done % args.log_every == 0 or done == steps):
                print(f"step {done}/{steps} loss {loss_last:.4f} lr {optimizer.param_groups[1]['lr']:.3e} "
                      f"{time.perf_counter() - step_start:.2f} s", flush=True)
        record = {"epoch": epoch + 1, "steps": done, "train_loss": sum(losses) / len(losses)}
        if args.eval_every_epoch:
            u = time.perf_counter()
            record["accuracy"] = evaluate(net, test_images, test_labels, False, args.channels_last)
            evaluations += time.perf_counter() - u
        per_epoch.append(record)
        print(f"epoch {epoch + 1} steps {done} train loss {record['train_loss']:.4f}" +
              (f" test accuracy {100 * record['accuracy']:.2f}%" if "accuracy" in record else ""), flush=True)
    t = time.perf_counter()
    lookahead.update(1.0)
    phases["lookahead"] += time.perf_counter() - t
    phases["train"] = time.perf_counter() - train_start - evaluations  # the epochs' evaluations are not timed

    t = time.perf_counter()
    tta_accuracy = evaluate(net, test_images, test_labels, True, args.channels_last)
    phases["tta"] = time.perf_counter() - t
    wall = time.perf_counter() - start - untimed - evaluations
    accuracy = evaluate(net, test_images, test_labels, False, args.channels_last)  # untimed

    metrics = {"framework": "pytorch", "version": torch.__version__, "recipe": "airbench94", "seed": args.seed,
               "threads": args.threads, "processes": 1, "steps": done, "epochs": done / STEPS_PER_EPOCH,
               "tta_accuracy": tta_accuracy, "accuracy": accuracy, "wall_time_s": wall, "phases_s": phases,
               "train_loss_last": loss_last,
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "cpu": results_file.machine()["cpu"], "per_epoch": per_epoch}
    if args.metrics_json:
        write_json(args.metrics_json, metrics)
    print(f"plain accuracy {accuracy:.4f}, last loss {loss_last:.4f}, of the training: data {phases['data']:.1f} s, "
          f"lookahead {phases['lookahead']:.1f} s; peak RSS {metrics['peak_rss_mib']:.0f} MiB")
    print(f"tta_accuracy {tta_accuracy:.4f} wall_time {wall:.1f} s (whitening {phases['whitening']:.1f}, "
          f"train {phases['train']:.1f}, tta {phases['tta']:.1f})", flush=True)
    return metrics


def write_json(path, doc):
    """Atomically: a reader never sees half a file."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="folder of the CIFAR-10 .bin files (default: $LOOM_DATA, then "
                                  "data/cifar-10-batches-bin, then ../shared/data/cifar-10-batches-bin)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--steps", type=int, help=f"train only this many steps (default all {TOTAL_STEPS}); the "
                                             "schedules keep the full run's shape, so a short run is its prefix")
    p.add_argument("--channels-last", action="store_true", help="model and images in channels_last (NHWC)")
    p.add_argument("--metrics-json", help="write the run's figures here (atomically)")
    p.add_argument("--eval-every-epoch", action="store_true",
                   help="test accuracy (one view) after every epoch, outside the timed wall clock")
    p.add_argument("--eval-limit", type=int, help="test on the first N test images only (smoke runs)")
    p.add_argument("--log-every", type=int, default=0, help="print the loss every N steps (0: per epoch only)")
    p.add_argument("--self-check", action="store_true",
                   help="check that the first conv whitens the patches (untimed), then train")
    p.add_argument("--no-tune", action="store_true", help="leave glibc's malloc as it is")
    args = p.parse_args()
    if args.steps is not None and not 0 < args.steps <= TOTAL_STEPS:
        p.error(f"--steps must be in 1..{TOTAL_STEPS}")
    restart_if_needed(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
