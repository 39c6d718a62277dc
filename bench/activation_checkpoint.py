"""What activation checkpointing saves, per model: train_cifar10 in one process on its own
virtual device (cpu:1) with --activation-checkpoint none, selective (every 2nd block) and
full, a few steps each; the run's peak max_memory_allocated, which does not depend on the
machine's load. The median step times of interleaved repeats are kept in the file as
"step_s" (against none: "time"), not rendered: they do depend on it, and the table in the
docs should hold only what another run on another day would reproduce.

    python3 bench/activation_checkpoint.py --out bench/results/activation_checkpoint.json
    python3 bench/report.py      # the table in docs/memory.md
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
import trainer_runs  # noqa: E402

MODES = [("none", []), ("selective", ["--activation-checkpoint", "selective"]),
         ("full", ["--activation-checkpoint", "full"])]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(results_file.ROOT, "build"))
    parser.add_argument("--models", default="resnet18,resnet50,vit_tiny")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    started = results_file.now()
    load = [os.getloadavg()[0]]
    rows = []
    for model in args.models.split(","):
        peaks, times = {}, {name: [] for name, _ in MODES}
        for _ in range(args.repeat):  # interleaved: the modes of one repeat run minutes apart at most
            for name, flags in MODES:
                run = trainer_runs.train(args.build, 1, ["--model", model, "--batch-size", str(args.batch_size),
                                                         "--max-steps", str(args.steps), "--device", "cpu:1",
                                                         "--threads", "2", "--quiet", *flags])
                peaks[name] = run["peak_mib"][0]
                times[name].append(run["metrics"]["median_step_s"])
                print(f"#   {model:10} {name:9} peak {peaks[name]:7.1f} MiB  step {times[name][-1]:.3f} s", flush=True)
            load.append(os.getloadavg()[0])
        for name, _ in MODES:
            rows.append({"model": model, "ac": name, "peak": peaks[name], "saved": 100 * (1 - peaks[name] / peaks["none"]),
                         "time": statistics.median(t / n for t, n in zip(times[name], times["none"])),
                         "step_s": times[name]})
    doc = results_file.document(
        f"Activation checkpointing, one process on cpu:1, batch {args.batch_size}, SGD with momentum "
        f"({args.steps} steps, {args.repeat} interleaved repeats)", "activation_checkpoint.py",
        [{"key": "model", "title": "model"}, {"key": "ac", "title": "--activation-checkpoint"},
         {"key": "peak", "title": "peak max_memory_allocated, MiB", "format": ".1f"},
         {"key": "saved", "title": "saved against none, %", "format": ".0f"}],
        rows, [], started, conditions=f"Load average during the run {min(load):.1f}-{max(load):.1f}.")
    if args.out:
        results_file.write(args.out, doc)


if __name__ == "__main__":
    main()
