"""loom's kernel search (--conv-benchmark, Note [Kernel autotuning] in core/cpu/kernel_benchmark.h)
against its fixed rules: training throughput with the search on and off, interleaved, and what
the search itself costs.

    meson compile -C build bench/bench_train
    python3 bench/conv_benchmark.py                     # airbench94 at 1024 and ResNet18 at 128, float32 and bf16
    python3 bench/conv_benchmark.py --rounds 5 --models resnet18:128 --amps none
    python3 bench/conv_benchmark.py --isas native,avx2  # and with every library held to AVX2

Each (model, batch, amp) runs bench_train's loom worker (one process, --threads threads,
--warmup steps that absorb the search, then --steps timed) `--rounds` times with the search
off and on, alternating, so that both see the same machine. Reported per row: the medians of
img/s, their ratio (on / off: above 1 the search found faster kernels than the fixed rules),
the search's cost (median wall time of a whole worker on minus off: the search happens once
per shape, in the first steps) and the peak memory of each. The airbench94 rows use the
speedrun's channels-last activations (LOOM_BENCH_MEMORY_FORMAT=channels_last). A bf16 row
also gives bf16 / float32 with the search on (the float32 figure from its own row): autocast
should never cost speed: the search's float32 fallback per pass, and autocast's per layer
(Note [Autocast precision by measurement]), are what stand for that. Its two workers (bf16
and float32, search on) take turns in the same rounds. --isas avx2 rows run as
bench_isa.py's AVX2 rows (Note [CPU ISA switch]: LOOM_CPU_ISA=avx2, ONEDNN_MAX_CPU_ISA=AVX2,
OPENBLAS_CORETYPE=Haswell), float32 only: AVX2 has no bfloat16 arithmetic.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import results_file

ROOT = results_file.ROOT


AVX2 = {"LOOM_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}


def worker(a, model, batch, amp, conv_benchmark, isa="native"):
    """(img/s, peak MiB, wall seconds) of one bench_train worker."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), **(AVX2 if isa == "avx2" else {}))
    if model == "airbench94":
        env["LOOM_BENCH_MEMORY_FORMAT"] = "channels_last"
    cmd = [a.bench_train, "--worker", f"--model={model}", "--mode=train", f"--batch={batch}",
           f"--threads={a.threads}", f"--warmup={a.warmup}", f"--steps={a.steps}", f"--amp={amp}",
           f"--conv-benchmark={conv_benchmark}"]
    start = time.monotonic()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if out.returncode != 0:
        sys.exit(f"conv_benchmark: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        if line.startswith("result "):
            _, _, _, rate, peak_kib = line.split()[:5]
            return float(rate), float(peak_kib) / 1024.0, wall
    sys.exit(f"conv_benchmark: no result line from {' '.join(cmd)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="airbench94:1024,resnet18:128", help="model:batch, comma-separated")
    p.add_argument("--amps", default="none,bf16")
    p.add_argument("--isas", default="native", help="native and/or avx2, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="interleaved off/on pairs per row")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--bench-train", default=os.path.join(ROOT, "build", "bench", "bench_train"))
    p.add_argument("--conditions", default="")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "conv_benchmark.json"))
    a = p.parse_args()
    if not os.path.exists(a.bench_train):
        sys.exit(f"conv_benchmark: {a.bench_train} does not exist; meson compile -C build bench/bench_train")
    started = results_file.now()
    rows = []
    for isa in a.isas.split(","):
        for spec in a.models.split(","):
            model, batch = spec.split(":")
            amps = [amp for amp in a.amps.split(",") if isa == "native" or amp == "none"]
            # (amp, search) cells of this model, in the order each round runs them.
            cells = [(amp, mode) for amp in amps for mode in ("off", "on")]
            runs = {cell: [] for cell in cells}
            for r in range(a.rounds):
                for amp, mode in cells:
                    runs[(amp, mode)].append(worker(a, model, int(batch), amp, mode, isa))
                    rate, peak, wall = runs[(amp, mode)][-1]
                    print(f"{isa} {model} batch {batch} amp {amp} search {mode} round {r + 1}: {rate:.1f} img/s, "
                          f"peak {peak:.0f} MiB, {wall:.1f} s", flush=True)
            med = {cell: [statistics.median(x[i] for x in runs[cell]) for i in range(3)] for cell in cells}
            for amp in amps:
                off, on = med[(amp, "off")], med[(amp, "on")]
                row = {"isa": isa, "model": model, "batch": int(batch), "amp": amp, "off": off[0], "on": on[0],
                       "ratio": on[0] / off[0], "search_s": on[2] - off[2], "peak_off": off[1], "peak_on": on[1]}
                if amp != "none" and ("none", "on") in med:
                    row["bf16_vs_f32"] = on[0] / med[("none", "on")][0]
                rows.append(row)
    columns = [{"key": "isa", "title": "instruction set"}, {"key": "model", "title": "model"}, {"key": "batch", "title": "batch"},
               {"key": "amp", "title": "amp"},
               {"key": "off", "title": "search off (img/s)", "format": ".1f"},
               {"key": "on", "title": "search on (img/s)", "format": ".1f"},
               {"key": "ratio", "title": "on / off", "format": ".2f", "ratio_of": "on / off"},
               {"key": "search_s", "title": "search (s, once)", "format": ".1f"},
               {"key": "peak_off", "title": "peak off (MiB)", "format": ".0f"},
               {"key": "peak_on", "title": "peak on (MiB)", "format": ".0f"},
               {"key": "bf16_vs_f32", "title": "bf16 / float32, search on", "format": ".2f",
                "ratio_of": "on / on@amp=none"}]
    title = (f"Kernel search on and off: loom training throughput, {a.threads} threads, {a.warmup} warm-up + "
             f"{a.steps} timed steps per worker, medians of {a.rounds} interleaved rounds")
    results_file.write(a.out, results_file.document(title, "conv_benchmark.py", columns, rows, [], started,
                                                    a.conditions, labels=["isa", "model", "batch", "amp"]))


if __name__ == "__main__":
    main()
