"""loom's kernel search (--conv-benchmark, Note [Kernel autotuning] in core/cpu/kernel_benchmark.h)
against its fixed rules: training throughput with the search on and off, interleaved, and what
the search itself costs.

    meson compile -C build bench/bench_train
    python3 bench/conv_benchmark.py                     # airbench94 at 1024 and ResNet18 at 128, float32 and bf16
    python3 bench/conv_benchmark.py --rounds 5 --models resnet18:128 --amps none

Each (model, batch, amp) runs bench_train's loom worker (one process, --threads threads,
--warmup steps that absorb the search, then --steps timed) `--rounds` times with the search
off and on, alternating, so that both see the same machine. Reported per row: the medians of
img/s, their ratio (on / off: above 1 the search found faster kernels than the fixed rules),
the search's cost (median wall time of a whole worker on minus off: the search happens once
per shape, in the first steps) and the peak memory of each. The airbench94 rows use the
speedrun's channels-last activations (LOOM_BENCH_MEMORY_FORMAT=channels_last). A bf16 row
also gives bf16 / float32 with the search on (the float32 figure from its own row): autocast
should never cost speed, and the search's float32 fallback is what stands for that.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import results_file

ROOT = results_file.ROOT


def worker(a, model, batch, amp, conv_benchmark):
    """(img/s, peak MiB, wall seconds) of one bench_train worker."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
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
    rows, float32_on = [], {}
    for spec in a.models.split(","):
        model, batch = spec.split(":")
        for amp in a.amps.split(","):
            runs = {"off": [], "on": []}
            for r in range(a.rounds):
                for mode in ("off", "on"):
                    runs[mode].append(worker(a, model, int(batch), amp, mode))
                    rate, peak, wall = runs[mode][-1]
                    print(f"{model} batch {batch} amp {amp} search {mode} round {r + 1}: {rate:.1f} img/s, "
                          f"peak {peak:.0f} MiB, {wall:.1f} s", flush=True)
            med = {m: [statistics.median(x[i] for x in runs[m]) for i in range(3)] for m in runs}
            row = {"model": model, "batch": int(batch), "amp": amp, "off": med["off"][0], "on": med["on"][0],
                   "ratio": med["on"][0] / med["off"][0], "search_s": med["on"][2] - med["off"][2],
                   "peak_off": med["off"][1], "peak_on": med["on"][1]}
            if amp == "none":
                float32_on[(model, batch)] = med["on"][0]
            elif (model, batch) in float32_on:
                row["bf16_vs_f32"] = med["on"][0] / float32_on[(model, batch)]
            rows.append(row)
    columns = [{"key": "model", "title": "model"}, {"key": "batch", "title": "batch"},
               {"key": "amp", "title": "amp"},
               {"key": "off", "title": "search off (img/s)", "format": ".1f"},
               {"key": "on", "title": "search on (img/s)", "format": ".1f"},
               {"key": "ratio", "title": "on / off", "format": ".2f"},
               {"key": "search_s", "title": "search (s, once)", "format": ".1f"},
               {"key": "peak_off", "title": "peak off (MiB)", "format": ".0f"},
               {"key": "peak_on", "title": "peak on (MiB)", "format": ".0f"},
               {"key": "bf16_vs_f32", "title": "bf16 / float32, search on", "format": ".2f"}]
    title = (f"Kernel search on and off: loom training throughput, {a.threads} threads, {a.warmup} warm-up + "
             f"{a.steps} timed steps per worker, medians of {a.rounds} interleaved rounds")
    results_file.write(a.out, results_file.document(title, "conv_benchmark.py", columns, rows, [], started,
                                                    a.conditions))


if __name__ == "__main__":
    main()
