#!/usr/bin/env python3
"""The speedrun's memory: loom's peak RSS against PyTorch's on the same run, and where loom's goes.

    meson compile -C build examples/airbench
    python3 bench/speedrun_memory.py --steps 30 --rounds 2                      # loom and PyTorch
    python3 bench/speedrun_memory.py --steps 30 --rounds 2 \\
        --loom-other OTHER/build/examples/airbench --other-label "loom at abc1234"  # and another loom build
    python3 bench/report.py                                                      # the table in docs/

Each run is one process training the airbench94 recipe's first --steps steps (seed, threads
and data alike; the schedules keep the whole run's shape) and then evaluating it as the
recipe does (the 6-view test-time augmentation at batch 2,000, then the one-view accuracy).
Runs interleave round by round (loom, the other loom build, PyTorch), so that all see the
same machine. Both programs measure their peak RSS the same way, getrusage's ru_maxrss at
the end, and write it with the rest of their figures to --metrics-json (the commands are
bench/time_to_accuracy.py's: PyTorch 1.13 with glibc's malloc tuned, loom with the kernel
search off). loom's runs also record the memory at the end of each phase (Note [Where the
speedrun's memory goes], examples/speedrun/airbench94.h): the peak RSS so far, the caching
allocator's peak tensors and reserved bytes within the phase, and oneDNN's scratchpads. A
build without those records gives its peak only.

Every run's figures are kept in --state (outside the repository), so an interrupted series
resumes where it stopped; the results file holds, per program and phase, the medians over
the rounds, and the ratio of the peaks.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
import time_to_accuracy  # noqa: E402  (its commands; imports no torch)
from airbench_torch import find_data, write_json  # noqa: E402

ROOT = results_file.ROOT
DEFAULT_OUT = os.path.join(ROOT, "bench", "results", "speedrun_memory.json")
DEFAULT_STATE = os.path.join(os.path.expanduser("~"), ".cache", "loom", "speedrun_memory")
TORCH_LABELS = {"torch": "PyTorch 1.13, NCHW (malloc tuned)", "torch_cl": "PyTorch 1.13, channels_last (malloc tuned)"}
PHASES = ["data", "whitening", "first step", "training", "tta", "accuracy"]


def run_one(a, kind, label, program, round_index, data):
    """One run's metrics, from --state if it ran before."""
    name = f"{kind}-steps{a.steps}-round{round_index}"
    final = os.path.join(a.state, name + ".json")
    if os.path.exists(final):
        with open(final) as f:
            return json.load(f)
    partial = os.path.join(a.state, name + ".partial.json")
    torch = kind.startswith("torch")
    options = types.SimpleNamespace(steps=a.steps, threads=a.threads, torch_python=a.torch_python,
                                    torch_args="--channels-last" if kind == "torch_cl" else "", loom=program,
                                    conv_benchmark="off", loom_args="", loomrun="")
    cmd, env = time_to_accuracy.command(options, "torch" if torch else "loom", a.seed, data, partial)
    print(f"[round {round_index}] {label}: {' '.join(cmd)}", flush=True)
    if a.dry_run:
        return None
    started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.path.join(a.state, name + ".log"), "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, **env), stdout=log, stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0 or not os.path.exists(partial):
        sys.exit(f"speedrun_memory: {label} failed (exit {rc}); its output is in {os.path.join(a.state, name + '.log')}")
    with open(partial) as f:
        metrics = json.load(f)
    metrics.update({"label": label, "elapsed_s": time.perf_counter() - started, "date": results_file.now(),
                    "cpu_s": after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime})
    write_json(final, metrics)
    os.remove(partial)
    print(f"[round {round_index}] {label}: peak RSS {metrics['peak_rss_mib']:.0f} MiB", flush=True)
    return metrics


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rows_of(label, runs):
    """A program's rows: one per phase where its runs recorded them, else its peak alone."""
    peak = median([r["peak_rss_mib"] for r in runs])
    if not all(r.get("memory") for r in runs):
        return [{"run": label, "phase": "the run", "peak_rss_mib": peak, "whole_run_peak_mib": peak, "n": len(runs)}]
    rows = []
    for phase in PHASES:
        found = [next((m for m in r["memory"] if m["phase"] == phase), None) for r in runs]
        if not all(found):
            continue
        rows.append({"run": label, "phase": phase, "n": len(runs),
                     "peak_rss_mib": median([m["peak_rss_mib"] for m in found]),
                     "peak_allocated_mib": median([m["peak_allocated_mib"] for m in found]),
                     "peak_reserved_mib": median([m["peak_reserved_mib"] for m in found]),
                     # builds whose oneDNN scratchpads were outside the allocator
                     "kernel_workspace_mib": median([m["kernel_workspace_mib"] for m in found])
                     if all("kernel_workspace_mib" in m for m in found) else None,
                     "data_mib": median([r.get("data_mib") for r in runs]) if phase == "data" else None})
    rows[-1]["whole_run_peak_mib"] = peak
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="training steps per run (the recipe's whole run: 476)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each loom build")
    p.add_argument("--torch-rounds", type=int, help="PyTorch runs (default: --rounds)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", help="CIFAR-10 folder (default: as loom finds it: $LOOM_DATA, data/, ...)")
    p.add_argument("--loom", default="build/examples/airbench", help="loom's airbench, from the repository")
    p.add_argument("--loom-other", help="another build's airbench to measure beside it (an absolute path)")
    p.add_argument("--other-label", default="loom, another build", help="its row's name")
    p.add_argument("--torch-layouts", default="torch,torch_cl",
                   help="PyTorch's runs: torch (NCHW, bench/airbench_torch.py's default), torch_cl (--channels-last: "
                        "loom's layout, and PyTorch's faster one here), or both")
    p.add_argument("--torch-python", default="/usr/bin/python3", help="a python with torch (Debian's python3-torch)")
    p.add_argument("--state", default=DEFAULT_STATE, help="where each run's figures are kept (outside the repository)")
    p.add_argument("--out", default=DEFAULT_OUT, help="the results file")
    p.add_argument("--conditions", default="", help="how quiet the machine was, for the results file")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = p.parse_args()
    a.torch_rounds = a.rounds if a.torch_rounds is None else a.torch_rounds
    a.state = os.path.abspath(os.path.expanduser(a.state))
    os.makedirs(a.state, exist_ok=True)
    data = find_data(a.data)
    started = results_file.now()
    programs = [("loom", f"loom, {a.threads} threads", a.loom, a.rounds)]
    if a.loom_other:
        programs.append(("other", a.other_label, a.loom_other, a.rounds))
    if a.torch_rounds:
        programs += [(kind, TORCH_LABELS[kind], None, a.torch_rounds) for kind in a.torch_layouts.split(",")]
    runs = {kind: [] for kind, *_ in programs}
    for round_index in range(max(n for *_, n in programs)):
        for kind, label, program, rounds in programs:
            if round_index < rounds:
                metrics = run_one(a, kind, label, program, round_index, data)
                if metrics:
                    runs[kind].append(metrics)
    if a.dry_run:
        return 0

    rows = []
    for kind, label, _, _ in programs:
        rows += rows_of(label, runs[kind])
    peaks = {kind: median([r["peak_rss_mib"] for r in runs[kind]]) for kind in runs}
    ratios = [{"name": f"{label}: peak RSS over loom's, medians of {a.steps}-step runs",
               "value": peaks[kind] / peaks["loom"]} for kind, label, _, _ in programs[1:]]
    columns = [
        {"key": "run", "title": "program"},
        {"key": "phase", "title": "at the end of"},
        {"key": "n", "title": "runs"},
        {"key": "whole_run_peak_mib", "title": "the run's peak RSS (MiB)", "format": ".0f"},
        {"key": "peak_rss_mib", "title": "peak RSS so far (MiB)", "format": ".0f"},
        {"key": "peak_allocated_mib", "title": "allocator: tensors, peak in the phase (MiB)", "format": ".0f"},
        {"key": "peak_reserved_mib", "title": "allocator: reserved, peak in the phase (MiB)", "format": ".0f"},
        {"key": "kernel_workspace_mib", "title": "oneDNN scratchpads outside the allocator (MiB)", "format": ".0f"},
        {"key": "data_mib", "title": "the data set's tensors (MiB)", "format": ".0f"},
    ]
    run = ("the whole airbench94 recipe" if a.steps == time_to_accuracy.TOTAL_STEPS
           else f"the airbench94 recipe's first {a.steps} steps")
    against = ": loom against PyTorch 1.13, medians of interleaved runs" if a.torch_rounds else ", medians"
    title = (f"Peak resident memory of {run} and its evaluation (6-view TTA at batch 2,000), {a.threads} threads, "
             f"seed {a.seed}{against}; loom's figures at the end of each phase")
    doc = results_file.document(title, "speedrun_memory.py", columns, rows, ratios, started, a.conditions,
                                labels=["run", "phase"])
    # Each run's peak, and its times: the training's wall time and the process's CPU time
    # (user + system, which a busy machine inflates less than the wall clock).
    doc["runs"] = [{"label": label, "peak_rss_mib": r["peak_rss_mib"], "train_s": r["phases_s"]["train"],
                    "cpu_s": r["cpu_s"], "date": r["date"]} for kind, label, _, _ in programs for r in runs[kind]]
    results_file.write(a.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
