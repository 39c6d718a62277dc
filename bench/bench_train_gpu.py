"""ResNet18-CIFAR training throughput on one GPU: loom vs PyTorch, in one table.

    python3 bench/bench_train_gpu.py --loom=build/bench/bench_train_gpu \\
        --batches=128,512 --precisions=fp32,tf32,bf16 --warmup=5 --steps=20

For every (batch, precision) it runs loom's worker (bench/bench_train_gpu.cpp) and then
bench/bench_train_torch.py --device=cuda, one process each and back to back, so both see
the same GPU state; each prints the median of --steps CUDA-event-timed steps after
--warmup steps. Precisions: fp32 (TF32 off everywhere), tf32 (TF32 in matmuls and cuDNN),
bf16 / fp16 (autocast around forward + loss; fp16 with a GradScaler). The ratio is
loom/torch img/s: > 1 means loom is faster. A run that fails or times out shows as
FAIL with its last stderr line, and the exit code is then 1.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, timeout):
    """(fields of the `result` line or None, the last stderr line)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s"
    for line in proc.stdout.splitlines():
        if line.startswith("result "):
            return line.split()[1:], ""
    err = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}, no result line"])[-1]
    return None, err


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loom", default="build/bench/bench_train_gpu", help="path of loom's worker")
    p.add_argument("--python", default=sys.executable, help="python with torch + CUDA")
    p.add_argument("--batches", default="128,512")
    p.add_argument("--precisions", default="fp32,tf32,bf16")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--timeout", type=int, default=120, help="seconds per process")
    p.add_argument("--out", help="also write the table (markdown) here")
    args = p.parse_args()

    header = ["batch", "precision", "loom img/s", "loom ms/step", "loom peak MiB", "torch img/s", "torch ms/step",
              "torch peak MiB", "loom/torch"]

    def table(rows):
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])

    def write_out(rows):  # after every configuration: a timeout kills this script, not its rows
        if args.out:
            with open(args.out + ".tmp", "w") as f:
                f.write(table(rows) + "\n")
            os.replace(args.out + ".tmp", args.out)

    rows, failed = [], False
    for batch in [int(b) for b in args.batches.split(",")]:
        for precision in args.precisions.split(","):
            common = [f"--batch={batch}", f"--warmup={args.warmup}", f"--steps={args.steps}"]
            loom, loom_err = run([args.loom, f"--precision={precision}"] + common, args.timeout)
            torch_flags = {"fp32": [], "tf32": ["--tf32"], "bf16": ["--amp=bf16"], "fp16": ["--amp=fp16"]}[precision]
            torch, torch_err = run([args.python, os.path.join(HERE, "bench_train_torch.py"), "--device=cuda",
                                    "--mode=train"] + common + torch_flags, args.timeout)
            # fields: mode batch precision img_per_s median_ms peak_mib
            row = [str(batch), precision]
            for name, fields, err in (("loom", loom, loom_err), ("torch", torch, torch_err)):
                row += [fields[3], fields[4], fields[5]] if fields else ["FAIL", "", ""]
                if not fields:
                    failed = True
                    print(f"# {name} batch {batch} {precision}: {err}", file=sys.stderr, flush=True)
            ratio = f"{float(loom[3]) / float(torch[3]):.2f}" if loom and torch else "-"
            rows.append(row + [ratio])
            write_out(rows)
            print(f"# done: batch {batch} {precision}: loom {row[2]} img/s, torch {row[5]} img/s", flush=True)

    print(table(rows))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
