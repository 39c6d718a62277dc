#!/usr/bin/env python3
"""ViT-tiny training throughput and attention alone: loom beside PyTorch, same steps.

    meson compile -C build bench/bench_vit
    /usr/bin/python3 bench/bench_vit_torch.py --batch 128 --threads 2

Runs build/bench/bench_vit (loom) and the same measurements here in PyTorch: the model is
bench/vit_parity_torch.py's (nn.TransformerEncoderLayer blocks), a step is forward,
cross-entropy, backward, clip_grad_norm_(1.0) and an AdamW step; attention is the
composition softmax(q k^T / 8) v at [batch, 3, 65, 64] forward and backward (PyTorch 1.13
has no scaled_dot_product_attention; its nn.MultiheadAttention computes this composition).
Each number is the median of --steps steps after two warm-up steps. PyTorch runs with
glibc's malloc tuned (GLIBC_TUNABLES, as bench_train's "torch tuned") unless --no-tune.
"""
import argparse
import os
import re
import subprocess
import sys
import time

TUNED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"


def median_ms(steps, step):
    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def torch_side(a):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from vit_parity_torch import CONFIGS, VisionTransformer
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    q, k, v = (torch.randn(a.batch, 3, 65, 64, requires_grad=True) for _ in range(3))
    g = torch.randn(a.batch, 3, 65, 64)

    def attention():
        (torch.softmax(q @ k.transpose(-2, -1) / 8.0, dim=-1) @ v).backward(g)

    print(f"sdpa ms={median_ms(a.steps, attention):.3f}")
    model = VisionTransformer(*CONFIGS[a.model])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    images, labels = torch.randn(a.batch, 3, 32, 32), torch.randint(0, 10, (a.batch,))

    def train():
        opt.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    ms = median_ms(a.steps, train)
    print(f"train img_s={a.batch * 1000 / ms:.1f} ms={ms:.1f}")


def parse(text):
    return {m.group(1): dict(kv.split("=") for kv in m.group(2).split()) for m in re.finditer(r"^(\w+) (.*)$", text, re.M)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default="vit_tiny", choices=["vit_tiny", "vit_small"])
    p.add_argument("--loom", default="build/bench/bench_vit")
    p.add_argument("--no-tune", action="store_true")
    p.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_worker:
        return torch_side(a)
    args = ["--batch", str(a.batch), "--steps", str(a.steps), "--threads", str(a.threads), "--model", a.model]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    loom = parse(subprocess.run([a.loom, *args], check=True, capture_output=True, text=True, env=env).stdout)
    if not a.no_tune:
        env["GLIBC_TUNABLES"] = TUNED
    torch = parse(subprocess.run([sys.executable, __file__, "--torch-worker", *args], check=True, capture_output=True,
                                 text=True, env=env).stdout)
    print(f"{a.model}, batch {a.batch}, {a.threads} threads, median of {a.steps} steps")
    print(f"  attention fwd+bwd [{a.batch}, 3, 65, 64]: loom {float(loom['sdpa']['ms']):.1f} ms, "
          f"torch {float(torch['sdpa']['ms']):.1f} ms ({float(torch['sdpa']['ms']) / float(loom['sdpa']['ms']):.2f}x)")
    print(f"  train step: loom {float(loom['train']['img_s']):.1f} img/s, torch {float(torch['train']['img_s']):.1f} img/s "
          f"({float(loom['train']['img_s']) / float(torch['train']['img_s']):.2f}x); loom peak {loom['train']['peak_mib']} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
