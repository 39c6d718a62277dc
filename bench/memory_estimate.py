"""train_cifar10 --estimate-memory against training: for each strategy, every rank's
predicted peak beside the max_memory_allocated that three training steps measure (the
trainer's "memory per rank" line), and how long the estimate took.

    python3 bench/memory_estimate.py --build build --out bench/results/memory_estimate.json

The peaks depend on the allocator only, not on the machine's speed or load.
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402  (the results file's provenance fields)

MEASURED = re.compile(r"rank (\d+) peak ([\d.]+), model state")
ESTIMATED = re.compile(r"^  (rank \d+|cpu:\d+): peak ([\d.]+) MiB", re.M)

# (label, ranks, flags): each a command line a user could type.
CONFIGS = [
    ("one process", 1, []),
    ("--mode ddp", 2, ["--mode", "ddp"]),
    ("--mode ddp --zero-redundancy-optimizer", 2, ["--mode", "ddp", "--zero-redundancy-optimizer"]),
    ("--mode fsdp (full_shard)", 2, ["--mode", "fsdp"]),
    ("--mode fsdp --sharding-strategy shard_grad_op", 2, ["--mode", "fsdp", "--sharding-strategy", "shard_grad_op"]),
    ("--pp 2 (1F1B, 4 micro-batches)", 2, ["--pp", "2"]),
    # The flags after the common ones win: on cpu the kernels' own workspace counts too,
    # and the estimate does not see it (Note [Shape-only runs]).
    ("one process, --device cpu", 1, ["--device", "cpu"]),
    ("one process, --model vit_tiny", 1, ["--model", "vit_tiny"]),
]


def run(build, ranks, flags):
    cmd = [os.path.join(build, "examples", "train_cifar10"), *flags]
    if ranks > 1:
        cmd = [os.path.join(build, "parallel", "loomrun"), "--standalone", "--nproc_per_node", str(ranks), *cmd]
    start = time.monotonic()
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed with exit status {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout, time.monotonic() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", default="32")
    parser.add_argument("--device", default="cpu:1", help="each rank's training device (cpu:1: the data and the "
                        "kernels' own workspace, on cpu, stay out of its figures)")
    parser.add_argument("--out", help="write the results file here")
    args = parser.parse_args()
    started = results_file.now()
    common = ["--model", args.model, "--batch-size", args.batch_size, "--device", args.device, "--synthetic",
              "--threads", "1", "--workers", "0", "--quiet"]
    rows = []
    for label, ranks, flags in CONFIGS:
        estimate, seconds = run(args.build, ranks, common + flags + ["--estimate-memory"])
        trained, _ = run(args.build, ranks, common + flags + ["--max-steps", "3", "--eval-limit", "0"])
        predicted = [float(p) for _, p in ESTIMATED.findall(estimate)]
        measured = [float(p) for _, p in sorted(MEASURED.findall(trained), key=lambda m: int(m[0]))]
        if len(predicted) != ranks or len(measured) != ranks:
            raise SystemExit(f"{label}: expected {ranks} ranks in both outputs, got:\n{estimate}\n{trained}")
        for rank in range(ranks):
            error = 100 * (predicted[rank] - measured[rank]) / measured[rank]
            rows.append({"config": label, "rank": rank, "estimated": predicted[rank], "measured": measured[rank],
                         "error": error, "seconds": seconds})
            print(f"{label:48s} rank {rank}: estimated {predicted[rank]:7.1f} MiB, measured {measured[rank]:7.1f} MiB "
                  f"({error:+.1f}%), estimate took {seconds:.1f} s")
    worst = max(abs(r["error"]) for r in rows)
    print(f"largest error {worst:.1f}%")
    if args.out:
        columns = [{"key": "config", "title": "flags (2 ranks unless one process)"},
                   {"key": "rank", "title": "rank"},
                   {"key": "estimated", "title": "estimated peak (MiB)", "format": ".1f"},
                   {"key": "measured", "title": "measured max_memory_allocated (MiB)", "format": ".1f"},
                   {"key": "error", "title": "error (%)", "format": "+.1f"},
                   {"key": "seconds", "title": "estimate took (s)", "format": ".1f"}]
        title = (f"{args.model}, batch {args.batch_size} per rank on {args.device}: --estimate-memory against three "
                 "training steps")
        results_file.write(args.out, results_file.document(
            title, "memory_estimate.py", columns, rows, [{"name": "largest error (%)", "value": worst,
                                                          "format": ".1f"}], started))


if __name__ == "__main__":
    main()
