#!/usr/bin/env python3
"""ViT-tiny training throughput and attention alone: loom beside PyTorch, same steps.

    meson compile -C build bench/bench_vit
    /usr/bin/python3 bench/bench_vit_torch.py --batch 128 --threads 2 --out bench/results/vit.json

Runs build/bench/bench_vit (loom) and the same measurements here in PyTorch: the model is
bench/vit_parity_torch.py's (nn.TransformerEncoderLayer blocks), a step is forward,
cross-entropy, backward, clip_grad_norm_(1.0) and an AdamW step; attention is the
composition softmax(q k^T / 8) v at [batch, 3, 65, 64] forward and backward (PyTorch 1.13
has no scaled_dot_product_attention; its nn.MultiheadAttention computes this composition).
Each number is the median of --steps steps after two warm-up steps, and of --repeat
interleaved runs of each side; all of it under three settings of the libraries (Note [Which
BLAS kernels each framework runs], below). PyTorch runs with glibc's malloc tuned
(GLIBC_TUNABLES, as bench_train's "torch tuned") unless --no-tune.
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

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


# Note [Which BLAS kernels each framework runs]
# Both frameworks call OpenBLAS for float32 products (loom only below 128x128x256
# multiply-adds on an AVX-512 CPU: Note [float32 matmul on oneDNN]), and OpenBLAS picks
# its kernels from OPENBLAS_CORETYPE when it is set. Machines whose OpenBLAS predates
# their CPU set it to Haswell (AVX2 kernels); this machine's environment does. So the
# ratio is measured three ways: with the environment as it is, with OPENBLAS_CORETYPE
# removed (OpenBLAS picks its AVX-512 kernels: PyTorch's fastest here), and with every
# library held to AVX2, as an AVX2-only CPU runs (bench/bench_isa.py's settings).
SETTINGS = [
    ("the environment's OpenBLAS kernels", {}),
    ("OpenBLAS free to pick (OPENBLAS_CORETYPE unset)", {"OPENBLAS_CORETYPE": None}),
    ("held to AVX2", {"LOOM_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
                      "ATEN_CPU_CAPABILITY": "avx2"}),
]


def environment(a, changes):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def median(values):
    return sorted(values)[len(values) // 2]


def measure(a, changes):
    """Interleaved repeats (loom, then PyTorch, a.repeat times): medians of each figure."""
    args = ["--batch", str(a.batch), "--steps", str(a.steps), "--threads", str(a.threads), "--model", a.model]
    env = environment(a, changes)
    torch_env = dict(env, GLIBC_TUNABLES=TUNED) if not a.no_tune else env
    runs = {"loom": [], "torch": []}
    for _ in range(a.repeat):
        runs["loom"].append(parse(subprocess.run([a.loom, *args], check=True, capture_output=True, text=True,
                                                 env=env).stdout))
        runs["torch"].append(parse(subprocess.run([sys.executable, __file__, "--torch-worker", *args], check=True,
                                                  capture_output=True, text=True, env=torch_env).stdout))
    pick = lambda who, line, key: median([float(r[line][key]) for r in runs[who]])  # noqa: E731
    return {"loom_img_s": pick("loom", "train", "img_s"), "torch_img_s": pick("torch", "train", "img_s"),
            "loom_sdpa_ms": pick("loom", "sdpa", "ms"), "torch_sdpa_ms": pick("torch", "sdpa", "ms"),
            "peak_mib": pick("loom", "train", "peak_mib")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="interleaved repeats of each side, medians reported")
    p.add_argument("--settings", default="0,1,2", help="which library settings to measure (indices into SETTINGS)")
    p.add_argument("--model", default="vit_tiny", choices=["vit_tiny", "vit_small"])
    p.add_argument("--loom", default="build/bench/bench_vit")
    p.add_argument("--no-tune", action="store_true")
    p.add_argument("--out", help="write a results file (bench/results/vit.json) for bench/report.py")
    p.add_argument("--conditions", default="", help="how quiet the machine was, for the results file")
    p.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.torch_worker:
        return torch_side(a)
    started = results_file.now()
    rows, ratios = [], []
    print(f"{a.model}, batch {a.batch}, {a.threads} threads, median of {a.steps} steps, {a.repeat} interleaved repeats")
    for index in (int(i) for i in a.settings.split(",")):
        name, changes = SETTINGS[index]
        m = measure(a, changes)
        step_ratio, sdpa_ratio = m["loom_img_s"] / m["torch_img_s"], m["torch_sdpa_ms"] / m["loom_sdpa_ms"]
        print(f"  {name}: train step loom {m['loom_img_s']:.1f} img/s, torch {m['torch_img_s']:.1f} img/s "
              f"({step_ratio:.2f}x); attention fwd+bwd loom {m['loom_sdpa_ms']:.1f} ms, torch "
              f"{m['torch_sdpa_ms']:.1f} ms ({sdpa_ratio:.2f}x); loom peak {m['peak_mib']:.1f} MiB", flush=True)
        rows += [{"setting": name, "what": "training step (forward, loss, backward, clipping, AdamW)", "unit": "img/s",
                  "loom": m["loom_img_s"], "torch": m["torch_img_s"], "speed_ratio": step_ratio},
                 {"setting": name, "what": f"attention forward + backward, [{a.batch}, 3, 65, 64]", "unit": "ms",
                  "loom": m["loom_sdpa_ms"], "torch": m["torch_sdpa_ms"], "speed_ratio": sdpa_ratio}]
        ratios.append({"name": f"training step, {name}: loom's speed / PyTorch's", "value": step_ratio})
    rows.append({"setting": "", "what": "loom's peak allocated memory in the training step", "unit": "MiB",
                 "loom": m["peak_mib"]})
    if a.out:
        columns = [{"key": "setting", "title": "libraries"}, {"key": "what", "title": "measured"},
                   {"key": "unit", "title": "unit"}, {"key": "loom", "title": "loom", "format": ".1f"},
                   {"key": "torch", "title": "PyTorch 1.13 (malloc tuned)", "format": ".1f"},
                   {"key": "speed_ratio", "title": "loom's speed / PyTorch's", "format": ".2f"}]
        title = (f"ViT-tiny against PyTorch 1.13 (malloc tuned): batch {a.batch}, {a.threads} threads, "
                 f"medians of {a.steps} steps x {a.repeat} interleaved repeats")
        results_file.write(a.out, results_file.document(title, "bench_vit_torch.py", columns, rows, ratios, started,
                                                        a.conditions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
