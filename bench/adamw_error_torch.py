#!/usr/bin/env python3
"""One AdamW step of loom and of PyTorch, both float32, against the float64 truth.

    meson compile -C build bench/adamw_step
    /usr/bin/python3 bench/adamw_error_torch.py

Draws float32 parameters, gradients and a mid-training state (exp_avg, exp_avg_sq at step
100), computes the step in float64 by PyTorch's formula (torch/optim/adamw.py), runs
torch.optim.AdamW on the float32 values and build/bench/adamw_step (loom's optim::AdamW) on
the same ones, and prints each one's largest and mean error against the truth. Exits 1 if
loom's largest error is more than --factor times PyTorch's.
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from reference_train_torch import read_safetensors  # noqa: E402


def write_safetensors(path, tensors):
    """The format's definition (u64 header length, JSON, raw data), float32 only."""
    import json
    import struct
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = np.ascontiguousarray(t, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def truth(p, g, m, v, step, lr, beta1, beta2, eps, wd):
    p, g, m, v = (x.astype(np.float64) for x in (p, g, m, v))
    p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - beta2 ** step) + eps
    return p - lr / (1 - beta1 ** step) * m / denom


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--loom", default="build/bench/adamw_step")
    ap.add_argument("--dir", default="/tmp/adamw")
    ap.add_argument("--factor", type=float, default=2.0, help="largest ratio of loom's error to PyTorch's that passes")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    n, beta1, beta2, eps, step = a.n, 0.9, 0.999, 1e-8, 100
    p = (rng.standard_normal(n) * 0.02).astype(np.float32)
    g = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    m = (rng.standard_normal(n) * 1e-4).astype(np.float32)
    v = (rng.random(n) * 1e-6).astype(np.float32)
    os.makedirs(a.dir, exist_ok=True)
    write_safetensors(os.path.join(a.dir, "in.safetensors"),
                      {"param": p, "grad": g, "exp_avg": m, "exp_avg_sq": v, "step": np.array([step - 1], np.float32)})
    subprocess.run([a.loom, "--in", os.path.join(a.dir, "in.safetensors"), "--out", os.path.join(a.dir, "loom.safetensors"),
                    "--lr", str(a.lr), "--weight-decay", str(a.weight_decay)], check=True)
    loom = read_safetensors(os.path.join(a.dir, "loom.safetensors"))["param"].numpy()

    tp = torch.nn.Parameter(torch.from_numpy(p.copy()))
    opt = torch.optim.AdamW([tp], lr=a.lr, betas=(beta1, beta2), eps=eps, weight_decay=a.weight_decay)
    tp.grad = torch.from_numpy(g.copy())
    opt.state[tp] = {"step": torch.tensor(float(step - 1)), "exp_avg": torch.from_numpy(m.copy()),
                     "exp_avg_sq": torch.from_numpy(v.copy())}
    opt.step()
    torch_p = tp.detach().numpy()

    want = truth(p, g, m, v, step, a.lr, beta1, beta2, eps, a.weight_decay)
    errors = {}
    for name, got in (("loom", loom), (f"torch {torch.__version__}", torch_p)):
        e = np.abs(got.astype(np.float64) - want)
        errors[name] = e.max()
        print(f"{name:>22}: max |float32 step - float64 truth| = {e.max():.3g}, mean {e.mean():.3g}")
    ratio = errors["loom"] / max(errors[f"torch {torch.__version__}"], 1e-300)
    ok = ratio <= a.factor
    print(f"{'PASS' if ok else 'FAIL'}: loom's largest error is {ratio:.2f}x PyTorch's (limit {a.factor:g}x), "
          f"{n:,} weights, step {step}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
