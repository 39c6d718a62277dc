#!/usr/bin/env python3
"""One SGD step through loom's Winograd convolutions and through PyTorch's, both float32,
against the float64 truth, at each thread count.

    meson compile -C build bench/winograd_step
    /usr/bin/python3 bench/winograd_error_torch.py [--threads 1,2,3,4] [--out bench/results/winograd_step.json]

The problem is tests/test_winograd.cpp's "one SGD step" case: build/bench/winograd_step
draws its x, w1, w2 and target from the test's seeds and computes the update
-lr * gradient of mean((conv(relu(conv(x, w1)), w2) - target)^2) (lr 0.1, padding 1, no
bias) in float64, and in float32 with loom's direct algorithm and loom's Winograd (NCHW
and channels-last), once per thread count (OMP_NUM_THREADS). PyTorch takes the same step
from the same values in float64 and, at each torch.set_num_threads, in float32. The error
is the test's: max |update - float64 update| / max |float64 update| (tests/tensor_compare.h's
relative_error). PyTorch's float64 update is the truth for both, after checking that
loom's float64 update agrees with it (to --agree). Exits 1 if loom's Winograd error is
more than --factor times PyTorch float32's at the same thread count.
"""
import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
from reference_train_torch import read_safetensors  # noqa: E402

LOOM_RUNS = ("direct", "direct_channels_last", "winograd", "winograd_channels_last")


def torch_step(x, w1, w2, target, lr, dtype, memory_format=torch.contiguous_format):
    """The updates of w1 and w2: one SGD step of conv -> relu -> conv on a mean squared error."""
    a = w1.detach().to(dtype).requires_grad_(True)
    b = w2.detach().to(dtype).requires_grad_(True)
    out = torch.nn.functional.conv2d(torch.relu(torch.nn.functional.conv2d(
        x.to(dtype).contiguous(memory_format=memory_format), a, padding=1)), b, padding=1)
    diff = out - target.to(dtype)
    (diff * diff).mean().backward()
    return [a.grad * -lr, b.grad * -lr]


def relative_error(got, want):
    """tests/tensor_compare.h's relative_error: max |got - want| / max |want|."""
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max()).item()


def cpu_features():
    """' (AVX-512 with avx512_bf16)' and the like, from /proc/cpuinfo's flags: the model name
    alone ('AMD EPYC') does not say which kernels oneDNN picks."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ""
    if "avx512f" not in flags:
        return " (AVX2)" if "avx2" in flags else ""
    return " (AVX-512 with avx512_bf16)" if "avx512_bf16" in flags else " (AVX-512)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2,3,4", help="thread counts, comma-separated")
    ap.add_argument("--loom", default="build/bench/winograd_step")
    ap.add_argument("--dir", default="/tmp/winograd")
    ap.add_argument("--lr", type=float, default=0.1, help="the test's (tests/test_winograd.cpp)")
    ap.add_argument("--factor", type=float, default=2.5, help="largest ratio of Winograd's error to PyTorch's that passes")
    ap.add_argument("--agree", type=float, default=1e-13, help="largest relative gap between the two float64 updates")
    ap.add_argument("--out", help="write a results file (bench/results/winograd_step.json) for bench/report.py")
    a = ap.parse_args()
    started = results_file.now()
    threads = [int(t) for t in a.threads.split(",")]
    os.makedirs(a.dir, exist_ok=True)
    loom = {}
    for t in threads:
        path = os.path.join(a.dir, f"loom_{t}threads.safetensors")
        subprocess.run([a.loom, "--out", path], check=True, env={**os.environ, "OMP_NUM_THREADS": str(t)})
        loom[t] = read_safetensors(path)
    inputs = loom[threads[0]]
    x, w1, w2, target = (inputs[k] for k in ("x", "w1", "w2", "target"))
    truth = torch_step(x, w1, w2, target, a.lr, torch.float64)
    gap = max(relative_error(loom[t][f"float64.w{i + 1}"], truth[i]) for t in threads for i in range(2))
    print(f"loom's float64 update against PyTorch's: {gap:.1e} relative")
    if gap > a.agree:
        print(f"FAIL: the two float64 updates differ by more than {a.agree:g}; neither can be the truth for the other")
        return 1

    rows, worst = [], 0.0
    print(f"{'threads':>7} {'weight':>6} {'PyTorch':>9} {'PyTorch cl':>10} {'direct':>9} {'direct cl':>9} "
          f"{'winograd':>9} {'wino cl':>9} {'wino/PyTorch':>12}")
    for t in threads:
        torch.set_num_threads(t)
        pt = torch_step(x, w1, w2, target, a.lr, torch.float32)
        pt_cl = torch_step(x, w1, w2, target, a.lr, torch.float32, torch.channels_last)
        for i in range(2):
            row = {"threads": t, "weight": f"w{i + 1}", "torch": relative_error(pt[i], truth[i]),
                   "torch_channels_last": relative_error(pt_cl[i], truth[i])}
            for run in LOOM_RUNS:
                row[run] = relative_error(loom[t][f"{run}.w{i + 1}"], truth[i])
            row["ratio"] = max(row["winograd"], row["winograd_channels_last"]) / row["torch"]
            worst = max(worst, row["ratio"])
            rows.append(row)
            print(f"{t:>7} {row['weight']:>6} {row['torch']:>9.2e} {row['torch_channels_last']:>10.2e} "
                  f"{row['direct']:>9.2e} {row['direct_channels_last']:>9.2e} {row['winograd']:>9.2e} "
                  f"{row['winograd_channels_last']:>9.2e} {row['ratio']:>11.2f}x")
    ok = worst <= a.factor
    print(f"{'PASS' if ok else 'FAIL'}: loom's Winograd error is at most {worst:.2f}x PyTorch float32's "
          f"(limit {a.factor:g}x)")
    if a.out:
        version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
        columns = [{"key": "threads", "title": "threads"}, {"key": "weight", "title": "weight"},
                   {"key": "torch", "title": f"PyTorch {version}", "format": ".2e"},
                   {"key": "torch_channels_last", "title": "PyTorch, channels-last", "format": ".2e"},
                   {"key": "direct", "title": "loom direct", "format": ".2e"},
                   {"key": "direct_channels_last", "title": "loom direct, channels-last", "format": ".2e"},
                   {"key": "winograd", "title": "loom Winograd", "format": ".2e"},
                   {"key": "winograd_channels_last", "title": "loom Winograd, channels-last", "format": ".2e"},
                   {"key": "ratio", "title": "Winograd (worse layout) / PyTorch", "format": ".2f"}]
        doc = results_file.document(
            "One SGD step (lr 0.1) of conv-ReLU-conv (batch 8, 32 channels, 16x16), float32 against float64: "
            "max |update error| / max |update| per weight and thread count",
            "winograd_error_torch.py", columns, rows,
            [{"name": "loom's Winograd against PyTorch float32, worst case", "value": worst}], started,
            conditions=f"threads: OMP_NUM_THREADS for loom, torch.set_num_threads for PyTorch; loom with LOOM_CPU_ISA=avx2 (its own Winograd); loom's float64 update agrees "
                       f"with PyTorch's to {gap:.0e}. OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}.")
        doc["command"] = "/usr/bin/" + doc["command"]
        doc["machine"]["cpu"] += cpu_features()
        results_file.write(a.out, doc)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
