"""What tensor parallelism holds and moves per rank, measured and against its formula: ResNet18
(CIFAR) trained a few steps at tp = 1 (one process), 2 and 4 with the ResNet plan
(docs/tensor_parallel.md), each rank reading the whole batch.

    python3 bench/tensor_parallel.py --out bench/results/tensor_parallel.json

Per configuration: the training state per rank (parameters, gradients, SGD momenta) as the
trainer counts it and as the formula gives it (the split tensors' 1/tp share plus the whole
rest, 12 bytes a float32 parameter), the allocator's peak per rank (activations included),
and the all-reduce bytes per step, measured (--metrics-json) and by the formula (each block's
output forward and input gradient backward, 2(tp-1)/tp of them per rank:
Note [Bytes a collective moves]). Bytes and state do not depend on the machine; the peak
depends on the allocator's caching only. Speed is bench_modes.py's row "loom tp N".
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

ROOT = results_file.ROOT
# ResNet18-CIFAR: its BasicBlocks as (output channels, output side, input channels, input side).
BLOCKS = [(64, 32, 64, 32)] * 2 + [(128, 16, 64, 32), (128, 16, 128, 16), (256, 8, 128, 16), (256, 8, 256, 8),
                                   (512, 4, 256, 8), (512, 4, 512, 4)]
PARAMETERS = 11_173_962
# Split by the plan: each block's conv1 and conv2 weights, and bn1's weight and bias.
SPLIT = sum(o * i * 9 + o * o * 9 + 2 * o for o, _, i, _ in BLOCKS)


def chunk(rows, tp):
    """torch.chunk's pieces of `rows` over tp ranks: rank 0 holds the first, the largest."""
    return -(-rows // tp)


def formula_state_mib(tp):
    split_rank0 = sum(chunk(o, tp) * i * 9 + o * chunk(o, tp) * 9 + 2 * chunk(o, tp) for o, _, i, _ in BLOCKS)
    return 12 * (PARAMETERS - SPLIT + split_rank0) / 2**20


def formula_bytes(tp, batch):
    if tp == 1:
        return 0
    elements = sum(o * so * so + i * si * si for o, so, i, si in BLOCKS) * batch
    return round(2 * (tp - 1) / tp * 4 * elements)


def run(args, tp, tmp):
    metrics = os.path.join(tmp, f"tp{tp}.json")
    train = [os.path.join(args.build, "examples", "train_cifar10"), "--synthetic", "--batch-size", str(args.batch_size),
             "--max-steps", str(args.steps), "--threads", "1", "--workers", "0", "--eval-limit", "0", "--quiet",
             "--metrics-json", metrics]
    cmd = train if tp == 1 else [os.path.join(args.build, "parallel", "loomrun"), "--standalone", "--nproc_per_node",
                                 str(tp), *train, "--tp", str(tp)]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True)
    with open(metrics) as f:
        m = json.load(f)
    return {"configuration": "single" if tp == 1 else f"tp {tp}", "state_mib": m["model_state_mib"],
            "state_formula_mib": round(formula_state_mib(tp), 1), "peak_mib": m["peak_memory_mib"],
            "all_reduce_bytes": m["comm_bytes_per_step"]["all_reduce"], "formula_bytes": formula_bytes(tp, args.batch_size)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--degrees", default="1,2,4")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", help="write the results file (bench/report.py renders it into docs/)")
    args = parser.parse_args()
    started = results_file.now()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(args, int(tp), tmp) for tp in args.degrees.split(",")]
    print(f"{'configuration':14s} {'state MiB':>9s} {'formula':>8s} {'peak MiB':>8s} {'all-reduce B/step':>18s} "
          f"{'formula':>12s}")
    for r in rows:
        print(f"{r['configuration']:14s} {r['state_mib']:9.1f} {r['state_formula_mib']:8.1f} {r['peak_mib']:8.1f} "
              f"{r['all_reduce_bytes']:18d} {r['formula_bytes']:12d}")
    if args.out:
        columns = [{"key": "configuration", "title": "configuration"},
                   {"key": "state_mib", "title": "training state per rank (MiB)", "format": ".1f"},
                   {"key": "state_formula_mib", "title": "formula (MiB)", "format": ".1f"},
                   {"key": "peak_mib", "title": "peak per rank (MiB)", "format": ".1f"},
                   {"key": "all_reduce_bytes", "title": "all-reduce bytes per step per rank"},
                   {"key": "formula_bytes", "title": "formula (bytes)"}]
        title = (f"Tensor parallelism on ResNet18 (CIFAR), batch {args.batch_size}, float32, SGD with momentum: "
                 "what each rank holds and moves")
        results_file.write(args.out, results_file.document(title, "tensor_parallel.py", columns, rows, [], started))


if __name__ == "__main__":
    main()
