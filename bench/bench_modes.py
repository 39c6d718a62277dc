"""Every parallel mode side by side on one machine: loom's single, dp, mp, pipeline (GPipe,
1F1B) and ddp, and PyTorch's single process, pipeline (Pipe) and DDP on the same job.

    python3 bench/bench_modes.py                    # ResNet18, global batch 64, 2 devices
    python3 bench/bench_modes.py --repeat 5 --steps 16

Each configuration trains the CIFAR ResNet18 on random CIFAR-shaped data with the same
global batch, on --devices devices (CPU virtual devices cpu:0, cpu:1, ... here) and
--devices cores in all: one process with --devices threads (single, dp, mp, pipeline),
or --devices processes of one thread (ddp, with the batch split between them). Runs are
interleaved --repeat times; the table gives img/s (global batch / median step; median
over repeats) and each mode against loom single, loom's peak tensor memory (the
allocator's, in the process or rank 0; the pipeline's checkpointing rows trade speed for
it), and the PyTorch rows against their loom counterparts (median of per-repeat ratios: configurations of one repeat run minutes apart
at most). PyTorch 1.13's DataParallel needs GPUs, so it has no row; its Pipe keeps one
worker per device, so with both stages on the CPU it runs GPipe's schedule on one worker.
Needs a built loom (build/) and, for the PyTorch rows, python3-torch (--torch-python).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ddp import free_port, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loom(args, tmp, mode, *extra, processes=1):
    metrics = os.path.join(tmp, "m.json")
    threads = args.devices if processes == 1 else 1
    batch = args.batch_size // processes
    cmd = [args.train, "--mode", mode, "--synthetic", "--batch-size", str(batch), "--max-steps", str(args.steps),
           "--epochs", "1", "--threads", str(threads), "--workers", "0", "--eval-limit", "0", "--quiet",
           "--metrics-json", metrics, *extra]
    if processes > 1:
        cmd = [args.loomrun, "--standalone", "--nproc_per_node", str(processes), "--numa-binding", "exclusive", *cmd]
    run(cmd, dict(os.environ, OMP_NUM_THREADS=str(threads)))
    with open(metrics) as f:
        m = json.load(f)
    args.peak_mib = m["peak_memory_mib"]
    return args.batch_size / m["median_step_s"]


def loom_pp(args, tmp, *extra):
    """The pipeline with one stage per process (--pp): every stage gets the whole global
    batch (not a share of it, as ddp's ranks do) and one thread, as the in-process
    pipeline's --devices threads are shared by its stages."""
    metrics = os.path.join(tmp, "m.json")
    cmd = [args.loomrun, "--standalone", "--nproc_per_node", str(args.devices), "--numa-binding", "exclusive",
           args.train, "--mode", "pipeline", "--pp", str(args.devices), "--synthetic", "--batch-size",
           str(args.batch_size), "--max-steps", str(args.steps), "--epochs", "1", "--threads", "1", "--workers", "0",
           "--eval-limit", "0", "--quiet", "--metrics-json", metrics, "--chunks", str(args.chunks), *extra]
    run(cmd, dict(os.environ, OMP_NUM_THREADS="1"))
    with open(metrics) as f:
        m = json.load(f)
    args.peak_mib = m["peak_memory_mib"]
    return args.batch_size / m["median_step_s"]


def torch_json(args, script, *extra):
    out = run([args.torch_python, os.path.join(ROOT, "bench", script), *extra], dict(os.environ))
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=4, help="pipeline micro-batches")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run; the first is not timed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--torch-python", default="/usr/bin/python3", help="a python that imports torch ('' skips)")
    args = parser.parse_args()
    args.train = os.path.join(args.build, "examples", "train_cifar10")
    args.loomrun = os.path.join(args.build, "parallel", "loomrun")
    d, c = str(args.devices), str(args.chunks)
    configs = [
        ("loom single", lambda t: loom(args, t, "single")),
        ("loom dp", lambda t: loom(args, t, "dp", "--dp-devices", d)),
        ("loom mp", lambda t: loom(args, t, "mp", "--mp-devices", d)),
        ("loom pipeline gpipe", lambda t: loom(args, t, "pipeline", "--mp-devices", d, "--chunks", c,
                                                "--pipeline-schedule", "gpipe")),
        ("loom pipeline 1f1b", lambda t: loom(args, t, "pipeline", "--mp-devices", d, "--chunks", c,
                                               "--pipeline-schedule", "1f1b")),
        ("loom pipeline gpipe, ckpt", lambda t: loom(args, t, "pipeline", "--mp-devices", d, "--chunks", c,
                                                      "--pipeline-schedule", "gpipe",
                                                      "--pipeline-checkpoint", "except_last")),
        ("loom pipeline 1f1b, ckpt", lambda t: loom(args, t, "pipeline", "--mp-devices", d, "--chunks", c,
                                                     "--pipeline-schedule", "1f1b", "--pipeline-checkpoint", "always")),
        ("loom ddp", lambda t: loom(args, t, "ddp", processes=args.devices)),
        # Interleaved 1F1B (2 model chunks per stage), and the stages as processes (--pp):
        # threads vs processes under each schedule.
        ("loom pipeline interleaved", lambda t: loom(args, t, "pipeline", "--mp-devices", d, "--chunks", c,
                                                     "--pipeline-schedule", "interleaved_1f1b", "--virtual-stages", "2")),
        ("loom pp processes gpipe", lambda t: loom_pp(args, t, "--pipeline-schedule", "gpipe")),
        ("loom pp processes 1f1b", lambda t: loom_pp(args, t, "--pipeline-schedule", "1f1b")),
        ("loom pp processes interleaved", lambda t: loom_pp(args, t, "--pipeline-schedule", "interleaved_1f1b",
                                                            "--virtual-stages", "2")),
    ]
    if args.torch_python:
        common = ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--threads", d]
        configs += [
            ("torch single", lambda t: torch_json(args, "pipeline_torch.py", *common, "--chunks", "0")["img_per_s"]),
            ("torch pipeline (Pipe, gpipe)", lambda t: torch_json(args, "pipeline_torch.py", *common, "--chunks", c,
                                                                  "--checkpoint", "never",
                                                                  "--port", str(free_port()))["img_per_s"]),
            ("torch pipeline (Pipe, gpipe), ckpt", lambda t: torch_json(args, "pipeline_torch.py", *common, "--chunks",
                                                                        c, "--checkpoint", "except_last",
                                                                        "--port", str(free_port()))["img_per_s"]),
            ("torch ddp", lambda t: torch_json(args, "ddp_torch.py", "--world-size", d, "--model", "resnet18",
                                               "--batch-size", str(args.batch_size // args.devices), "--steps",
                                               str(args.steps), "--port", str(free_port()))["img_per_s"]),
        ]
    results = {name: [] for name, _ in configs}
    peaks = {name: [] for name, _ in configs if name.startswith("loom")}
    print(f"# ResNet18, global batch {args.batch_size}, {args.devices} devices/cores, pipeline {args.chunks} "
          f"micro-batches, {args.steps - 1} timed steps, {args.repeat} interleaved repeats", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for name, fn in configs:
                results[name].append(fn(tmp))
                if name in peaks:
                    peaks[name].append(args.peak_mib)
                print(f"#   repeat {r + 1}: {name:30s} {results[name][-1]:7.1f} img/s", flush=True)
    single = results["loom single"]
    print(f"{'configuration':30s} {'img/s':>7s}  {'/ loom single':>13s}  {'peak MiB':>8s}  img/s of each repeat")
    for name, v in results.items():
        paired = statistics.median(x / s for x, s in zip(v, single))
        peak = f"{statistics.median(peaks[name]):8.0f}" if name in peaks else f"{'':8s}"
        print(f"{name:30s} {statistics.median(v):7.1f}  {paired:13.2f}  {peak}  {' '.join(f'{x:.1f}' for x in v)}")
    for mine, theirs in [("loom single", "torch single"), ("loom pipeline gpipe", "torch pipeline (Pipe, gpipe)"),
                         ("loom pipeline gpipe, ckpt", "torch pipeline (Pipe, gpipe), ckpt"), ("loom ddp", "torch ddp")]:
        if theirs in results:
            paired = statistics.median(x / y for x, y in zip(results[mine], results[theirs]))
            print(f"{mine} / {theirs} = {paired:.2f} (median of per-repeat ratios)")
    for mine, theirs in [("loom pp processes gpipe", "loom pipeline gpipe"), ("loom pp processes 1f1b", "loom pipeline 1f1b"),
                         ("loom pp processes interleaved", "loom pipeline interleaved"),
                         ("loom pp processes gpipe", "torch pipeline (Pipe, gpipe)")]:
        if theirs in results:
            paired = statistics.median(x / y for x, y in zip(results[mine], results[theirs]))
            print(f"{mine} / {theirs} = {paired:.2f} (median of per-repeat ratios)")


if __name__ == "__main__":
    main()
