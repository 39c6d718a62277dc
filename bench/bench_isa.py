#!/usr/bin/env python3
"""ResNet18-CIFAR training, loom against PyTorch 1.13, with every library held to AVX2 and
unrestricted, in one run: how loom does on the many x86 CPUs without AVX-512.

    python3 bench/bench_isa.py --repeat 3 --out bench/results/train_isa.json

Each cell is one process of bench_train's loom worker or of bench_train_torch.py (PyTorch
with glibc told to keep freed memory, bench_train's "torch tuned"), 2 threads, float32,
batch 128 and 32; the commands of a row take turns for --repeat rounds (so that a change
in the machine's load hits them alike) and each cell is the median. A ratio is the ratio of
the medians beside it, so that it follows from the figures shown (bench/docs_figures.py checks
it). The 1-minute load average is read before every process.

AVX2 rows run under Note [CPU ISA switch] (core/cpu/cpu_isa.h): LOOM_CPU_ISA=avx2,
ONEDNN_MAX_CPU_ISA=AVX2, OPENBLAS_CORETYPE=Haswell, and ATEN_CPU_CAPABILITY=avx2 for
PyTorch. There loom feeds channels-last images, so that no activation is reordered between
layers (Note [Channels-last on AVX2], core/cpu/activation_layout.h; PyTorch keeps its NCHW
default). Their second loom column is LOOM_CONV2D_ALGO=direct on NCHW images, what loom ran
on AVX2 before it had Winograd convolutions of its own (oneDNN has them only for AVX-512). The
unrestricted rows' second loom column is LOOM_CPU_ISA=avx2 alone: loom's own Winograd
(on OpenBLAS's AVX-512 sgemm) in place of oneDNN's.
"""
import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

ROOT = results_file.ROOT
TUNED = {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"}
AVX2 = {"LOOM_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
        "ATEN_CPU_CAPABILITY": "avx2"}


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def measure(command, env):
    """img/s from the `result` line the command prints, and the load before it started."""
    before = load()
    out = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("result "):
            return float(line.split()[3]), before
    sys.exit(f"bench_isa: {' '.join(command)} printed no result line:\n{out.stdout}\n{out.stderr}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batches", default="128,32")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--python", default="/usr/bin/python3", help="a Python with torch (Debian's)")
    parser.add_argument("--out", help="write a results file (bench/results/train_isa.json)")
    args = parser.parse_args()
    started = results_file.now()
    rows = []
    # The unrestricted rows are named by what this CPU has (on an AVX2-only CPU they run the
    # same kernels as the AVX2 rows, and the ratios between them measure the restriction's
    # own cost: nothing).
    native = {"avx512_bf16": "native (AVX-512 + bf16)", "avx512f": "native (AVX-512)"}.get(
        results_file.machine()["isa"], "native (AVX2)")
    for isa, env in (("AVX2", AVX2), (native, {})):
        for batch in [int(b) for b in args.batches.split(",")]:
            common = [f"--mode=train", f"--batch={batch}", f"--warmup={args.warmup}", f"--steps={args.steps}",
                      f"--threads={args.threads}", "--amp=none"]
            loom = [os.path.join(ROOT, "build/bench/bench_train"), "--worker"] + common
            torch = [args.python, os.path.join(ROOT, "bench/bench_train_torch.py")] + common
            alt_env = ({**env, "LOOM_CONV2D_ALGO": "direct", "LOOM_BENCH_MEMORY_FORMAT": "contiguous"} if env
                       else {"LOOM_CPU_ISA": "avx2"})
            cells = {"torch": [], "loom": [], "alt": []}
            loads = []
            for _ in range(args.repeat):
                for key, command, extra in (("torch", torch, {**env, **TUNED}), ("loom", loom, env),
                                            ("alt", loom, alt_env)):
                    rate, before = measure(command, extra)
                    cells[key].append(rate)
                    loads.append(before)
                    print(f"{isa:17s} batch {batch:3d} {key:5s} {rate:7.1f} img/s  (load {before:.1f})", flush=True)
            medians = {key: round(statistics.median(cells[key]), 2) for key in cells}
            rows.append({
                "isa": isa, "batch": batch,
                "loom": medians["loom"], "alt": medians["alt"], "torch_tuned": medians["torch"],
                "vs_tuned": round(medians["loom"] / medians["torch"], 2),
                "vs_alt": round(medians["loom"] / medians["alt"], 2),
                "load": f"{min(loads):.1f}-{max(loads):.1f}",
            })
    columns = [{"key": "isa", "title": "ISA"}, {"key": "batch", "title": "batch"},
               {"key": "loom", "title": "loom img/s", "format": ".1f"},
               {"key": "alt", "title": "loom direct (AVX2) / loom's own Winograd (native) img/s", "format": ".1f"},
               {"key": "torch_tuned", "title": "torch tuned img/s", "format": ".1f"},
               {"key": "vs_tuned", "title": "loom / torch tuned", "format": ".2f", "ratio_of": "loom / torch_tuned"},
               {"key": "vs_alt", "title": "loom / second loom column", "format": ".2f", "ratio_of": "loom / alt"},
               {"key": "load", "title": "load average"}]
    title = (f"ResNet18-CIFAR training, float32, {args.threads} threads, AVX2-restricted and unrestricted "
             f"(median of {args.repeat} interleaved processes per cell, {args.steps} timed steps each)")
    for row in rows:
        print(row)
    if args.out:
        results_file.write(args.out, results_file.document(title, "bench_isa.py", columns, rows, [], started,
                                                           labels=["isa", "batch"]))


if __name__ == "__main__":
    main()
