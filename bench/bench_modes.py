"""Every parallel mode side by side on one machine: loom's single, dp, mp, pipeline (GPipe,
1F1B), ddp and ddp + ZeRO-1, and PyTorch's single process, pipeline (Pipe), DDP and DDP +
ZeroRedundancyOptimizer on the same job.

    python3 bench/bench_modes.py                    # ResNet18, global batch 64, 2 devices
    python3 bench/bench_modes.py --repeat 5 --steps 16

Each configuration trains the CIFAR ResNet18 on random CIFAR-shaped data with the same
global batch, on --devices devices (CPU virtual devices cpu:0, cpu:1, ... here) and
--devices cores in all: one process with --devices threads (single, dp, mp, pipeline),
or --devices processes of one thread (ddp, with the batch split between them). Runs are
interleaved --repeat times; the table gives img/s (global batch / median step; median
over repeats) and each mode against loom single, loom's peak tensor memory (the
allocator's high-water mark on the process's first device, cpu:0, or on rank 0: train_cifar10's
peak_memory_mib; the pipeline's checkpointing rows trade speed for
it), rank 0's model state (parameters + gradients + optimizer state, model_state_mib: what
ZeRO-1 shards; docs/sharding.md), rank 0's bytes moved by collectives per step (every kind,
comm_mib_per_step; docs/communication.md), and the PyTorch rows against their loom counterparts.
Every ratio, in the table and in the list under it, is the ratio of the two medians shown
(so that the bars and the ratios beside them agree; bench/docs_checks.py checks it), with
the spread of the per-repeat ratios beside it (configurations of one repeat run minutes
apart at most). PyTorch 1.13's DataParallel needs GPUs, so it has no row; its Pipe keeps one
worker per device, so with both stages on the CPU it runs GPipe's schedule on one worker.
Needs a built loom (build/) and, for the PyTorch rows, python3-torch (--torch-python).

    python3 bench/bench_modes.py --out bench/results/modes.json --chart docs/img/modes.png
    python3 bench/report.py                           # the table in docs/benchmarks.md from it

--out FILE writes the results file that docs/benchmarks.md's table is rendered from
(bench/report.py: per mode img/s, against loom single, peak memory, model state, bytes per
step, the PyTorch counterpart's img/s, every repeat; the paired ratios; the command, the
machine, the commit and the date). --chart FILE.png draws it (and FILE.svg), two panels:
throughput and memory (matplotlib, Debian's python3-matplotlib; bench/plotting.py installs
it); --chart with --from FILE redraws a results file without running anything.
A quick check that it all runs: --steps 2 --repeat 1 --batch-size 8 --model tiny --torch-python ''.
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
from bench_ddp import free_port, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loom(args, tmp, mode, *extra, processes=1, replicas=None):
    """One run of train_cifar10: {"img_per_s", "peak_mib"[, "model_state_mib"]}. The global
    batch is split between `replicas` data-parallel replicas (default: every process is
    one, as in ddp; a pipeline of processes (--pp) is one replica whose stages all read
    the whole batch). Processes get a core each while there are enough cores."""
    metrics = os.path.join(tmp, "m.json")
    threads = args.devices if processes == 1 else 1
    batch = args.batch_size // (processes if replicas is None else replicas)
    cmd = [args.train, "--mode", mode, "--model", args.model, "--synthetic", "--batch-size", str(batch),
           "--max-steps", str(args.steps), "--epochs", "1", "--threads", str(threads), "--workers", "0",
           "--eval-limit", "0", "--quiet", "--metrics-json", metrics, *extra]
    if processes > 1:
        binding = ["--numa-binding", "exclusive"] if processes <= (os.cpu_count() or 1) else []
        cmd = [args.loomrun, "--standalone", "--nproc_per_node", str(processes), *binding, *cmd]
    run(cmd, dict(os.environ, OMP_NUM_THREADS=str(threads)))
    with open(metrics) as f:
        m = json.load(f)
    out = {"img_per_s": args.batch_size / m["median_step_s"], "peak_mib": m["peak_memory_mib"]}
    if "model_state_mib" in m:  # parameters + gradients + optimizer state per device (rank 0's)
        out["model_state_mib"] = m["model_state_mib"]
    if "comm_bytes_per_step" in m:  # rank 0's collectives per step, every kind (docs/communication.md)
        out["comm_mib_per_step"] = sum(m["comm_bytes_per_step"].values()) / 2**20
    return out


def loom_pp(args, tmp, *extra):
    """The pipeline with one stage per process (--pp): each stage gets the whole global
    batch and one thread, as the in-process pipeline's --devices threads are shared by
    its stages."""
    return loom(args, tmp, "pipeline", "--pp", str(args.devices), "--chunks", str(args.chunks), *extra,
                processes=args.devices, replicas=1)


def torch_json(args, script, *extra):
    out = run([args.torch_python, os.path.join(ROOT, "bench", script), *extra], dict(os.environ))
    return {"img_per_s": json.loads([line for line in out.splitlines() if line.startswith("{")][-1])["img_per_s"]}


# loom's row -> its PyTorch counterpart's
COUNTERPARTS = {"loom single": "torch single", "loom pipeline gpipe": "torch pipeline (Pipe, gpipe)",
                "loom pipeline gpipe, ckpt": "torch pipeline (Pipe, gpipe), ckpt", "loom ddp": "torch ddp",
                "loom ddp+zero1": "torch ddp+zero1"}


def summarise(results):
    """One record per configuration: medians over the repeats, and the ratios per repeat."""
    single = [r["img_per_s"] for r in results["loom single"]]
    rows = []
    for name, runs in results.items():
        ips = [r["img_per_s"] for r in runs]
        row = {"mode": name, "img_per_s": round(statistics.median(ips), 2),
               "speedup_vs_single": round(statistics.median(ips) / statistics.median(single), 3),
               "peak_mib": None, "model_state_mib": None, "comm_mib_per_step": None, "torch_img_per_s": None,
               "img_per_s_runs": [round(x, 2) for x in ips]}
        for key in ("peak_mib", "model_state_mib", "comm_mib_per_step"):
            values = [r[key] for r in runs if key in r]
            if values:
                row[key] = round(statistics.median(values), 1)
        theirs = COUNTERPARTS.get(name)
        if theirs in results:
            row["torch_img_per_s"] = round(statistics.median(r["img_per_s"] for r in results[theirs]), 2)
        rows.append(row)
    return rows


# The columns of the results file, in the order docs/benchmarks.md shows them.
COLUMNS = [{"key": "mode", "title": "configuration"}, {"key": "img_per_s", "title": "img/s", "format": ".1f"},
           {"key": "speedup_vs_single", "title": "/ loom single", "format": ".2f",
            "ratio_of": "img_per_s / img_per_s@mode=loom single"},
           {"key": "peak_mib", "title": "peak MiB", "format": ".0f"},
           {"key": "model_state_mib", "title": "model state MiB", "format": ".1f"},
           {"key": "comm_mib_per_step", "title": "comm MiB / step", "format": ".1f"},
           {"key": "torch_img_per_s", "title": "PyTorch counterpart img/s", "format": ".1f"},
           {"key": "img_per_s_runs", "title": "img/s of each repeat", "format": ".1f"}]

# Paired ratios worth a name: (this row, against that row). Each is the ratio of the two
# rows' medians, with the range of the per-repeat ratios (the machine's drift) beside it.
PAIRS = [("loom mp", "loom single"), ("loom pipeline 1f1b", "loom pipeline gpipe"),
         ("loom ddp+zero1", "loom ddp"), ("loom fsdp full_shard", "loom ddp"), ("loom fsdp shard_grad_op", "loom ddp"),
         ("loom fsdp2 full_shard", "loom fsdp full_shard"), ("loom pp 2 x fsdp2 2", "loom pp 2 x fsdp 2"),
         ("loom fsdp2 2 x tp 2", "loom fsdp 2 x tp 2"), ("loom pp processes gpipe", "loom pipeline gpipe"), ("loom pp processes 1f1b", "loom pipeline 1f1b"),
         ("loom pp processes interleaved", "loom pipeline interleaved"),
         ("loom pp processes gpipe", "torch pipeline (Pipe, gpipe)")] + list(COUNTERPARTS.items())


def paired_ratios(rows):
    """[{"name": "A / B (...)", "value": A's median img/s / B's}] for every pair present."""
    runs = {r["mode"]: r["img_per_s_runs"] for r in rows}
    ratios = []
    for mine, theirs in PAIRS:
        if mine not in runs or theirs not in runs:
            continue
        each = [x / y for x, y in zip(runs[mine], runs[theirs])]
        ratios.append({"name": f"{mine} / {theirs} (ratio of the medians; repeats {min(each):.2f}-{max(each):.2f})",
                       "value": round(statistics.median(runs[mine]) / statistics.median(runs[theirs]), 2)})
    return ratios


def resummarise(document):
    """A results file's ratios again, by this script's rule, from the repeats it keeps."""
    rows = document["rows"]
    single = next(r for r in rows if r["mode"] == "loom single")["img_per_s_runs"]
    for row in rows:
        row["img_per_s"] = round(statistics.median(row["img_per_s_runs"]), 2)
        row["speedup_vs_single"] = round(statistics.median(row["img_per_s_runs"]) / statistics.median(single), 3)
    document["ratios"] = paired_ratios(rows)
    return document


def results_document(rows, header, started):
    what = "Every mode side by side" if len(rows) > 2 else " and ".join(r["mode"] for r in rows) + " side by side"
    return results_file.document(f"{what} ({header})", "bench_modes.py", COLUMNS, rows,
                                 paired_ratios(rows), started)


def draw_chart(path, document):
    """Two panels, loom's rows only: throughput (with each PyTorch counterpart) and memory."""
    from plotting import pyplot
    rows, header = document["rows"], document["title"]
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    plt = pyplot()
    loom_rows = [r for r in rows if r["mode"].startswith("loom")]
    names = [r["mode"][5:] for r in loom_rows]
    y = list(range(len(loom_rows)))[::-1]
    fig, (tp, mem) = plt.subplots(1, 2, figsize=(11, 1.4 + 0.38 * len(loom_rows)), sharey=True)
    h = 0.38
    tp.barh([v + h / 2 for v in y], [r["img_per_s"] for r in loom_rows], h, color="#4C8BF5", label="loom")
    torch = [(v, r["torch_img_per_s"]) for v, r in zip(y, loom_rows) if r["torch_img_per_s"]]
    if torch:
        tp.barh([v - h / 2 for v, _ in torch], [t for _, t in torch], h, color="#EE4C2C", label="PyTorch counterpart")
    for v, r in zip(y, loom_rows):
        tp.text(r["img_per_s"], v + h / 2, f" {r['img_per_s']:.0f} ({r['speedup_vs_single']:.2f}x)", va="center",
                fontsize=7)
    tp.set_xlim(0, 1.3 * max(max(r["img_per_s"], r["torch_img_per_s"] or 0) for r in loom_rows))
    tp.set_yticks(y)
    tp.set_yticklabels(names, fontsize=8)
    tp.set_xlabel("img/s, median of the repeats (in brackets: against loom single)")
    tp.set_title("throughput", fontsize=9)
    tp.legend(fontsize=7, loc="best")
    mem.barh([v + h / 2 for v in y], [r["peak_mib"] or 0 for r in loom_rows], h, color="#F5A623",
             label="peak tensor memory (cpu:0 / rank 0)")
    state = [(v, r["model_state_mib"]) for v, r in zip(y, loom_rows) if r["model_state_mib"]]
    if state:
        mem.barh([v - h / 2 for v, _ in state], [m for _, m in state], h, color="#2CA02C",
                 label="model state (cpu:0's process / rank 0)")
    mem.set_xlabel("MiB (2^20 bytes)")
    mem.set_title("memory", fontsize=9)
    mem.set_xlim(0, 1.3 * max(max(r["peak_mib"] or 0, r["model_state_mib"] or 0) for r in loom_rows))
    mem.legend(fontsize=7, loc="best")
    for ax in (tp, mem):
        ax.grid(axis="x", color="#EEEEEE")
        ax.set_axisbelow(True)
    fig.suptitle(f"{header}\n{document['machine']['cpu']}, {document['machine']['cores']} cores, "
                 "commit {}, {}".format(results_file.commit_hash(document["commit"]), document["date"]), fontsize=8)
    fig.tight_layout()
    base = os.path.splitext(path)[0]
    for ext in ("png", "svg"):
        fig.savefig(base + "." + ext, dpi=90)
    plt.close(fig)
    print(f"wrote {base}.png, {base}.svg")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=4, help="pipeline micro-batches")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run; the first is not timed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--torch-python", default="/usr/bin/python3", help="a python that imports torch ('' skips)")
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "tiny"],
                        help="tiny: a quick check of the script (PyTorch rows only with resnet18)")
    parser.add_argument("--rows", help="run only the configurations whose name matches this regular expression "
                        "(and loom single, the reference), e.g. 'ddp|fsdp'")
    parser.add_argument("--out", help="write the results file (JSON; bench/report.py renders it into docs/)")
    parser.add_argument("--chart", help="draw the results as FILE.png and FILE.svg")
    parser.add_argument("--from", dest="from_file", help="with --chart: redraw this results file, run nothing")
    parser.add_argument("--resummarise", metavar="FILE",
                        help="recompute FILE's ratios from the repeats it keeps, in place (run nothing)")
    args = parser.parse_args()
    if args.resummarise:
        with open(args.resummarise) as f:
            document = resummarise(json.load(f))
        with open(args.resummarise, "w") as f:  # its provenance (command, commit, date) stays the run's
            json.dump(document, f, indent=1)
            f.write("\n")
        print(f"rewrote {args.resummarise}'s ratios")
        return
    if args.from_file:
        with open(args.from_file) as f:
            draw_chart(args.chart, json.load(f))
        return
    started = results_file.now()
    if args.chart:
        from plotting import pyplot
        pyplot()  # before the runs: it may start this script again under Debian's python3
    if args.model != "resnet18":
        args.torch_python = ""
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
        ("loom ddp+zero1", lambda t: loom(args, t, "ddp", "--zero-redundancy-optimizer", processes=args.devices)),
        # Interleaved 1F1B (2 virtual stages per stage), and the stages as processes (--pp):
        # threads vs processes under each schedule.
        ("loom pipeline interleaved", lambda t: loom(args, t, "pipeline", "--mp-devices", d, "--chunks", c,
                                                     "--pipeline-schedule", "interleaved_1f1b", "--virtual-stages", "2")),
        ("loom pp processes gpipe", lambda t: loom_pp(args, t, "--pipeline-schedule", "gpipe")),
        ("loom pp processes 1f1b", lambda t: loom_pp(args, t, "--pipeline-schedule", "1f1b")),
        ("loom pp processes interleaved", lambda t: loom_pp(args, t, "--pipeline-schedule", "interleaved_1f1b",
                                                            "--virtual-stages", "2")),
        # pp x dp: 2 pipelines of 2 stages (4 processes; on a 2-core machine they share the
        # cores, so this row shows that it runs and what it holds, not its speed).
        ("loom ddp --pp 2 (pp 2 x dp 2)", lambda t: loom(args, t, "ddp", "--pp", "2", "--chunks", c,
                                                         processes=4, replicas=2)),
        # The guide's recipe: a pipeline whose stages are sharded (FSDP per stage), and one
        # whose stages' optimizer states are (ZeRO-1 per stage); 4 processes, as above.
        ("loom pp 2 x fsdp 2", lambda t: loom(args, t, "single", "--pp", "2", "--dp-shard", "2", "--chunks", c,
                                              "--fsdp-layout", "flat", processes=4, replicas=2)),
        ("loom pp 2 x fsdp2 2", lambda t: loom(args, t, "single", "--pp", "2", "--dp-shard", "2", "--chunks", c,
                                               "--fsdp-layout", "per_parameter", processes=4, replicas=2)),
        ("loom pp 2 x zero1 2", lambda t: loom(args, t, "single", "--pp", "2", "--dp-replicate", "2",
                                               "--zero-redundancy-optimizer", "--chunks", c, processes=4, replicas=2)),
        # Tensor parallelism (docs/tensor_parallel.md): every block's 3x3 convolutions split
        # over a process per device; the ranks all read the whole global batch.
        (f"loom tp {d}", lambda t: loom(args, t, "single", "--tp", d, processes=args.devices, replicas=1)),
        # FSDP x TP: 2 data-parallel replicas of 2 tp ranks (4 processes, as pp x dp above), in
        # either layout (FSDP2 cuts each tp shard again on dim 0).
        ("loom fsdp 2 x tp 2", lambda t: loom(args, t, "single", "--dp-shard", "2", "--tp", "2", "--fsdp-layout", "flat",
                                              processes=4, replicas=2)),
        ("loom fsdp2 2 x tp 2", lambda t: loom(args, t, "single", "--dp-shard", "2", "--tp", "2", "--fsdp-layout",
                                               "per_parameter", processes=4, replicas=2)),
        # The sharded family (docs/sharding.md, docs/fsdp.md): as ddp, a process per device.
        # "fsdp": FSDP1's flat layout; "fsdp2": the per-parameter one (train_cifar10's default).
        ("loom fsdp full_shard", lambda t: loom(args, t, "fsdp", "--sharding-strategy", "full_shard",
                                                "--fsdp-layout", "flat", processes=args.devices)),
        ("loom fsdp shard_grad_op", lambda t: loom(args, t, "fsdp", "--sharding-strategy", "shard_grad_op",
                                                   "--fsdp-layout", "flat", processes=args.devices)),
        # FSDP2's layout (fully_shard): the same units and collectives, each parameter cut on dim 0.
        ("loom fsdp2 full_shard", lambda t: loom(args, t, "fsdp", "--sharding-strategy", "full_shard",
                                                 "--fsdp-layout", "per_parameter", processes=args.devices)),
    ]
    if args.torch_python:
        common = ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--threads", d]
        configs += [
            ("torch single", lambda t: torch_json(args, "pipeline_torch.py", *common, "--chunks", "0")),
            ("torch pipeline (Pipe, gpipe)", lambda t: torch_json(args, "pipeline_torch.py", *common, "--chunks", c,
                                                                  "--checkpoint", "never",
                                                                  "--port", str(free_port()))),
            ("torch pipeline (Pipe, gpipe), ckpt", lambda t: torch_json(args, "pipeline_torch.py", *common, "--chunks",
                                                                        c, "--checkpoint", "except_last",
                                                                        "--port", str(free_port()))),
            ("torch ddp", lambda t: torch_json(args, "ddp_torch.py", "--world-size", d, "--model", "resnet18",
                                               "--batch-size", str(args.batch_size // args.devices), "--steps",
                                               str(args.steps), "--port", str(free_port()))),
            ("torch ddp+zero1", lambda t: torch_json(args, "ddp_torch.py", "--world-size", d, "--model", "resnet18",
                                                     "--batch-size", str(args.batch_size // args.devices), "--steps",
                                                     str(args.steps), "--port", str(free_port()),
                                                     "--zero-redundancy-optimizer")),
        ]
    if args.rows:
        configs = [(name, fn) for name, fn in configs if re.search(args.rows, name) or name == "loom single"]
    results = {name: [] for name, _ in configs}
    header = (f"{args.model}, global batch {args.batch_size}, {args.devices} devices/cores, pipeline {args.chunks} "
              f"micro-batches, {args.steps - 1} timed steps, {args.repeat} interleaved repeats")
    print(f"# {header}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for name, fn in configs:
                results[name].append(fn(tmp))
                print(f"#   repeat {r + 1}: {name:30s} {results[name][-1]['img_per_s']:7.1f} img/s", flush=True)
    rows = summarise(results)
    print(f"{'configuration':30s} {'img/s':>7s}  {'/ loom single':>13s}  {'peak MiB':>8s}  {'state MiB':>9s}  "
          f"{'comm MiB/step':>13s}  img/s of each repeat")
    for row in rows:
        peak = f"{row['peak_mib']:8.0f}" if row["peak_mib"] is not None else f"{'':8s}"
        state = f"{row['model_state_mib']:9.1f}" if row["model_state_mib"] is not None else f"{'':9s}"
        comm = f"{row['comm_mib_per_step']:13.1f}" if row["comm_mib_per_step"] is not None else f"{'':13s}"
        print(f"{row['mode']:30s} {row['img_per_s']:7.1f}  {row['speedup_vs_single']:13.2f}  {peak}  {state}  {comm}  "
              f"{' '.join(f'{x:.1f}' for x in row['img_per_s_runs'])}")
    document = results_document(rows, header, started)
    for ratio in document["ratios"]:
        print(f"{ratio['name']} = {ratio['value']:.2f}")
    if args.out:
        results_file.write(args.out, document)
    if args.chart:
        draw_chart(args.chart, document)

if __name__ == "__main__":
    main()
