"""The roofline of ResNet18-CIFAR training on this machine, per instruction set: the FLOPs a
training step needs if every convolution is computed directly, against the machine's
sgemm rate (a convolution is a matrix multiply in disguise, and sgemm is the fastest one
OpenBLAS has), and the img/s that leaves; beside it what loom and PyTorch train at
(bench/results/train_isa.json, bench_isa.py's run).

    python3 bench/roofline.py --out bench/results/roofline.json

Direct FLOPs per training image: every convolution and the head three times (forward, input
gradient, weight gradient), 2 * Cout * Hout * Wout * Cin * kH * kW each: 3.33 GFLOP for
ResNet18-CIFAR. Winograd convolutions do fewer multiplies than that (F(4x4, 3x3): 4x fewer
in the 3x3 layers), so above 100% of the roofline a run is counted in direct FLOPs.
sgemm is bench_ops' (2048^3, OpenBLAS, 2 threads), with OpenBLAS's kernels held to Haswell
(AVX2) or left to choose (AVX-512 here).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

ROOT = results_file.ROOT


def resnet18_cifar_train_flops():
    """Direct FLOPs of one image's forward and backward (3 passes of every conv and the head)."""
    convs = [(3, 64, 32, 3)]  # (Cin, Cout, output side, kernel)
    cin = 64
    for stage, (width, side) in enumerate([(64, 32), (128, 16), (256, 8), (512, 4)]):
        for block in range(2):
            convs.append((cin, width, side, 3))
            convs.append((width, width, side, 3))
            if block == 0 and stage > 0:
                convs.append((cin, width, side, 1))  # the shortcut's 1x1
            cin = width
    forward = sum(2 * cout * side * side * c * k * k for c, cout, side, k in convs) + 2 * 512 * 10
    return 3 * forward


def sgemm_gflops(args, coretype):
    """bench_ops' sgemm rate, median of --repeat runs, with OpenBLAS held to `coretype`
    (None: OpenBLAS chooses for the CPU)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["OMP_NUM_THREADS"] = str(args.threads)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    rates = []
    for _ in range(args.repeat):
        out = subprocess.run([os.path.join(args.build, "bench", "bench_ops"), "--runs=3"], capture_output=True,
                             text=True, env=env, check=True)
        rates.append(float(re.search(r"sgemm .*: ([0-9.]+) GFLOP/s", out.stdout).group(1)))
    return statistics.median(rates)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--train", default=os.path.join(ROOT, "bench", "results", "train_isa.json"))
    parser.add_argument("--out", help="write the results file (bench/report.py renders it into docs/)")
    args = parser.parse_args()
    started = results_file.now()
    flops = resnet18_cifar_train_flops()
    with open(args.train) as f:
        trained = {(r["isa"], r["batch"]): r for r in json.load(f)["rows"]}
    rows = []
    for isa, coretype in [("AVX2", "Haswell"), ("native (AVX-512)", None)]:
        rate = sgemm_gflops(args, coretype)
        roof = round(rate * 1e9 / flops, 1)  # the percentages follow from the figures shown
        run = trained.get((isa, 128), {})
        rows.append({"isa": isa, "sgemm_gflops": round(rate, 1), "roofline_img_s": roof,
                     "loom_img_s": run.get("loom"), "loom_of_roof": round(100 * run["loom"] / roof) if run else None,
                     "torch_img_s": run.get("torch_tuned"),
                     "torch_of_roof": round(100 * run["torch_tuned"] / roof) if run else None})
    print(f"direct FLOPs per training image: {flops / 1e9:.2f} GFLOP")
    for r in rows:
        print(r)
    if args.out:
        columns = [{"key": "isa", "title": "ISA"}, {"key": "sgemm_gflops", "title": "sgemm GFLOP/s", "format": ".1f"},
                   {"key": "roofline_img_s", "title": "direct roofline img/s", "format": ".1f"},
                   {"key": "loom_img_s", "title": "loom img/s (batch 128)", "format": ".1f"},
                   {"key": "loom_of_roof", "title": "loom, % of roofline",
                    "ratio_of": "100 * loom_img_s / roofline_img_s"},
                   {"key": "torch_img_s", "title": "torch tuned img/s", "format": ".1f"},
                   {"key": "torch_of_roof", "title": "torch, % of roofline",
                    "ratio_of": "100 * torch_img_s / roofline_img_s"}]
        title = (f"The direct-convolution roofline of ResNet18-CIFAR training ({flops / 1e9:.2f} GFLOP per image) "
                 f"per instruction set, {args.threads} threads, against loom and PyTorch at batch 128 "
                 "(bench/results/train_isa.json)")
        results_file.write(args.out, results_file.document(title, "roofline.py", columns, rows, [], started))


if __name__ == "__main__":
    main()
