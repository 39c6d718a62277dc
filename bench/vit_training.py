#!/usr/bin/env python3
"""ViT-tiny on the real CIFAR-10: loom against PyTorch from the same weights and data order
(compare), and the accuracy loom reaches in a longer run, epoch by epoch (curve).

    meson compile -C build examples/train_cifar10
    python3 bench/vit_training.py compare --epochs 2 --warmup-epochs 0.2 --threads 2
    python3 bench/vit_training.py curve --epochs 6 --warmup-epochs 0.6 --threads 2 \\
        --chart docs/img/vit_curve.png
    python3 bench/vit_training.py curve --from bench/results/vit_curve.json --chart docs/img/vit_curve.png
    python3 bench/report.py            # the tables in docs/transformer.md from the results files

The recipe is docs/transformer.md's: AdamW (lr 1e-3, weight decay 0.05 off norms, biases
and embeddings), linear warm-up then cosine to 0 over the whole run, gradients clipped to
norm 1, batch 128. `compare` saves loom's initial ViT-tiny (train_cifar10 --max-steps 0
--save), trains it in loom and in PyTorch 1.13 (scripts/reference_train_torch.py, which
loads the same weights and implements the same schedule and parameter groups) on the
training set in file order (--no-shuffle --no-augment: the order both can reproduce), and
tests both on all 10,000 test images after every epoch. The two differ by float rounding
only, which grows with the steps, so their accuracies agree to a fraction of a point.
`curve` trains loom alone with shuffling and augmentation (random crop and flip), as a
user would. Neither is a speed figure: bench/bench_vit_torch.py measures speed.

Two frameworks on 2 cores take hours; --loom-log and --torch-log read the output of runs
already made with the commands this script prints (--dry-run), for instance one per core
with --threads 1 at the same time.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

# The line both trainers print after every epoch (train/trainer.cpp, the reference script).
EPOCH = re.compile(r"^epoch (\d+)/(\d+)\s+train loss ([\d.]+)\s+train acc ([\d.]+)%\s+test loss ([\d.]+)\s+"
                   r"test acc ([\d.]+)%\s+time ([\d.]+)s\s+([\d.]+) img/s", re.M)

COLUMNS = [
    {"key": "framework", "title": "framework"},
    {"key": "epoch", "title": "epoch"},
    {"key": "train_loss", "title": "train loss", "format": ".4f"},
    {"key": "train_acc", "title": "train acc (%)", "format": ".2f"},
    {"key": "test_loss", "title": "test loss", "format": ".4f"},
    {"key": "test_acc", "title": "test acc (%)", "format": ".2f"},
]


def recipe(args):
    return ["--model", "vit_tiny", "--epochs", str(args.epochs), "--batch-size", "128", "--optimizer", "adamw",
            "--lr", "1e-3", "--weight-decay", "0.05", "--schedule", "warmup_cosine", "--warmup-epochs",
            str(args.warmup_epochs), "--clip-grad-norm", "1", "--threads", str(args.threads)]


def epochs_of(text, framework):
    rows = [{"framework": framework, "epoch": int(m[1]), "train_loss": float(m[3]), "train_acc": float(m[4]),
             "test_loss": float(m[5]), "test_acc": float(m[6]), "seconds": float(m[7]), "img_per_s": float(m[8])}
            for m in EPOCH.finditer(text)]
    if not rows:
        raise SystemExit(f"vit_training: no 'epoch k/N ...' lines in {framework}'s output:\n{text[-2000:]}")
    return rows


def run(cmd, dry_run):
    print("+ " + " ".join(cmd), flush=True)
    if dry_run:
        return ""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"vit_training: failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def read(path):
    with open(path) as f:
        return f.read()


def compare(args, started):
    trainer = os.path.join(args.build, "examples", "train_cifar10")
    with tempfile.TemporaryDirectory() as tmp:
        init = args.init or os.path.join(tmp, "init.safetensors")
        if not args.init:
            run([trainer, "--model", "vit_tiny", "--max-steps", "0", "--eval-limit", "0", "--save", init], args.dry_run)
        order = ["--init", init, "--no-shuffle", "--no-augment"]
        loom_cmd = [trainer, *order, *recipe(args)]
        torch_cmd = ["/usr/bin/python3", os.path.join(results_file.ROOT, "scripts", "reference_train_torch.py"),
                     "--init", init, *recipe(args)]
        loom_out = read(args.loom_log) if args.loom_log else run(loom_cmd, args.dry_run)
        torch_out = read(args.torch_log) if args.torch_log else run(torch_cmd, args.dry_run)
    if args.dry_run:
        return
    rows = epochs_of(loom_out, "loom") + epochs_of(torch_out, "PyTorch 1.13")
    last = {r["framework"]: r for r in rows if r["epoch"] == args.epochs}
    gap = last["loom"]["test_acc"] - last["PyTorch 1.13"]["test_acc"]
    ratios = [{"name": f"loom's test accuracy minus PyTorch's after {args.epochs} epochs (points)", "value": gap,
               "format": "+.2f"}]
    print(f"test accuracy after {args.epochs} epochs: loom {last['loom']['test_acc']:.2f}%, "
          f"PyTorch {last['PyTorch 1.13']['test_acc']:.2f}% (difference {gap:+.2f} points)")
    doc = results_file.document(f"ViT-tiny, {args.epochs} epochs of CIFAR-10 from the same weights and data order: "
                                "loom and PyTorch 1.13", "vit_training.py", COLUMNS, rows, ratios, started,
                                args.conditions)
    results_file.write(args.out or os.path.join(results_file.ROOT, "bench", "results", "vit_quality.json"), doc)


def curve(args, started):
    if args.from_file:
        with open(args.from_file) as f:
            return draw(json.load(f), args.chart)
    trainer = os.path.join(args.build, "examples", "train_cifar10")
    cmd = [trainer, *recipe(args)]
    out = read(args.loom_log) if args.loom_log else run(cmd, args.dry_run)
    if args.dry_run:
        return
    rows = epochs_of(out, "loom")
    best = max(rows, key=lambda r: r["test_acc"])
    print(f"loom, {args.epochs} epochs: test accuracy {rows[-1]['test_acc']:.2f}% (best {best['test_acc']:.2f}% "
          f"after epoch {best['epoch']})")
    doc = results_file.document(f"ViT-tiny trained by loom for {args.epochs} epochs of CIFAR-10 (shuffled, random "
                                "crop and flip), tested after every epoch", "vit_training.py", COLUMNS, rows, [],
                                started, args.conditions)
    results_file.write(args.out or os.path.join(results_file.ROOT, "bench", "results", "vit_curve.json"), doc)
    if args.chart:
        draw(doc, args.chart)


def draw(doc, path):
    import plotting  # bench/plotting.py: matplotlib, installed on demand
    plt = plotting.pyplot()
    rows = doc["rows"]
    epochs = [r["epoch"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, key, label in ((axes[0], "acc", "accuracy (%)"), (axes[1], "loss", "cross-entropy")):
        axis.plot(epochs, [r[f"train_{key}"] for r in rows], marker="o", label="train (augmented, during the epoch)")
        axis.plot(epochs, [r[f"test_{key}"] for r in rows], marker="o", label="test (10,000 images)")
        axis.set_xticks(epochs)
        axis.set_xlabel("epoch")
        axis.set_ylabel(label)
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    fig.suptitle(f"{doc['title']}\n{doc['machine']['cpu']}, commit {doc['commit']}; redraw: python3 bench/"
                 f"vit_training.py curve --from bench/results/vit_curve.json --chart {path}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["compare", "curve"])
    p.add_argument("--build", default=os.path.join(results_file.ROOT, "build"))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--warmup-epochs", type=float, default=0.2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", help="compare: start from these weights instead of a fresh ViT-tiny")
    p.add_argument("--loom-log", help="read loom's output of this run instead of running it")
    p.add_argument("--torch-log", help="compare: read PyTorch's output instead of running it")
    p.add_argument("--conditions", default="", help="how the runs were made, for the results file")
    p.add_argument("--out", help="the results file (default bench/results/vit_quality.json or vit_curve.json)")
    p.add_argument("--chart", help="curve: draw the curve here (PNG)")
    p.add_argument("--from", dest="from_file", help="curve: draw --chart from this results file without running")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = p.parse_args()
    started = results_file.now()
    compare(args, started) if args.what == "compare" else curve(args, started)


if __name__ == "__main__":
    main()
