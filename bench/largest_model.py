"""The largest model each strategy trains under one memory budget per device, found by
running it: for every strategy (one device, DDP, ZeRO-1, FSDP's shard_grad_op and
full_shard, a pipeline of 4 stages, pp 2 x FSDP 2, tensor parallel over 4 ranks), with and
without activation checkpointing, train_cifar10 trains the models of torchvision's ResNet
family (deeper, then wider: resnet18 ... resnet152, wide_resnet50_2, wide_resnet101_2) two
steps with --device-memory-limit BUDGET on each rank's device, going up the family while a
model trains and down while one stops with an OutOfMemoryError. Beside every run that
trained, --estimate-memory's prediction of the same run (shape-only steps: no arithmetic).

    python3 bench/largest_model.py --out bench/results/largest_model.json \\
        --points bench/results/memory_estimate_points.json --chart docs/img/largest_model.png
    python3 bench/largest_model.py --from bench/results/largest_model.json --chart docs/img/largest_model.png
    python3 bench/report.py            # the tables in docs/memory.md from the two files

Each rank trains on its own virtual device cpu:1 (the data stays in host memory, outside the
budget, as a GPU's budget leaves host memory out); the global batch is --batch-size images,
split between the data-parallel replicas (a pipeline's and a tensor-parallel group's ranks
all see their replica's whole batch). Memory does not depend on timing, so a loaded machine
measures it exactly; it takes some 20 minutes on 2 cores.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
import trainer_runs  # noqa: E402

# torchvision's family, deeper then wider, with CIFAR-stem parameter counts (10 classes).
FAMILY = [("resnet18", 11_173_962), ("resnet34", 21_282_122), ("resnet50", 23_520_842),
          ("resnet101", 42_512_970), ("resnet152", 58_156_618), ("wide_resnet50_2", 66_847_050),
          ("wide_resnet101_2", 124_850_506)]

# name, ranks, flags, data-parallel replicas (the global batch is split between them).
STRATEGIES = [
    ("one device", 1, [], 1),
    ("DDP", 4, ["--mode", "ddp"], 4),
    ("ZeRO-1", 4, ["--mode", "ddp", "--zero-redundancy-optimizer"], 4),
    ("FSDP shard_grad_op", 4, ["--mode", "fsdp", "--sharding-strategy", "shard_grad_op"], 4),
    ("FSDP full_shard", 4, ["--mode", "fsdp"], 4),
    ("pipeline, 4 stages", 4, ["--pp", "4", "--microbatches", "4"], 1),
    ("pp 2 x FSDP 2", 4, ["--pp", "2", "--dp-shard", "2", "--microbatches", "2"], 2),
    ("tensor parallel 4", 4, ["--tp", "4"], 1),
]


def flags_of(args, strategy, model, checkpointing):
    _, _, extra, replicas = strategy
    flags = [*extra, "--model", model, "--batch-size", str(args.batch_size // replicas), "--max-steps", "2",
             "--device", "cpu:1", "--device-memory-limit", args.budget, "--quiet"]
    return flags + (["--activation-checkpoint", "full"] if checkpointing else [])


def measure(args, strategy, model, checkpointing):
    """A training run: {"model", "trained", "measured_mib": per rank or None}."""
    run = trainer_runs.attempt(args.build, strategy[1], flags_of(args, strategy, model, checkpointing),
                               env={"LOOM_OOM_ADVICE": "0"})
    if not run["ok"] and not run["out_of_memory"]:
        raise SystemExit(f"{run['command']}\nfailed, and not for memory:\n{run['output'][-3000:]}")
    print(f"#   {strategy[0]:20} {'AC' if checkpointing else '  '} {model:18} "
          f"{'trains, peak ' + str(max(run['peak_mib'])) + ' MiB' if run['ok'] else 'out of memory'}", flush=True)
    return {"model": model, "trained": run["ok"], "measured_mib": run["peak_mib"] if run["ok"] else None}


def estimate(args, strategy, model, checkpointing):
    """--estimate-memory's predicted peak of each rank, MiB."""
    run = trainer_runs.attempt(args.build, strategy[1],
                               flags_of(args, strategy, model, checkpointing) + ["--estimate-memory"])
    if not run["ok"]:
        raise SystemExit(f"{run['command']}\nfailed:\n{run['output'][-3000:]}")
    return run["metrics"]["peak_mib"]


def search(args, strategy, checkpointing, start):
    """Every run of the walk up (or down) the family from `start`, and the index of the largest
    model that trained (-1: none)."""
    runs, i = [], start
    first = measure(args, strategy, FAMILY[i][0], checkpointing)
    runs.append(first)
    step = 1 if first["trained"] else -1
    largest = i if first["trained"] else -1
    while 0 <= i + step < len(FAMILY):
        i += step
        run = measure(args, strategy, FAMILY[i][0], checkpointing)
        runs.append(run)
        if run["trained"]:
            largest = i
            if step == -1:  # walking down: the first that trains is the largest
                break
        elif step == 1:  # walking up: the first that does not train ends the walk
            break
    return runs, largest


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(results_file.ROOT, "build"))
    parser.add_argument("--budget", default="1GiB", help="--device-memory-limit of every rank's device")
    parser.add_argument("--batch-size", type=int, default=32, help="global batch")
    parser.add_argument("--out", help="results file: the largest model per strategy")
    parser.add_argument("--points", help="results file: every run that trained, predicted against measured")
    parser.add_argument("--chart", help="draw the results (PNG, and SVG beside it)")
    parser.add_argument("--from", dest="from_file", help="draw --chart from this results file without running")
    parser.add_argument("--measured", help="keep the training runs' outcomes here and reuse those it holds: "
                        "predictions can then be made again without training again")
    args = parser.parse_args()
    if args.from_file:
        with open(args.from_file) as f:
            doc = json.load(f)
        draw(doc, args.chart)
        return
    started = results_file.now()
    params = dict(FAMILY)
    rows, points = [], []
    searches = {}  # "strategy|ac" -> (runs, largest): the measured half, kept in --measured
    if args.measured and os.path.exists(args.measured):
        with open(args.measured) as f:
            searches = {k: tuple(v) for k, v in json.load(f).items()}
    start = 2  # where the walk begins: the last strategy's largest without checkpointing, or this one's
    for strategy in STRATEGIES:
        for checkpointing in (False, True):
            key = f"{strategy[0]}|{checkpointing}"
            if key not in searches:
                searches[key] = search(args, strategy, checkpointing, start)
                if args.measured:
                    with open(args.measured, "w") as f:
                        json.dump(searches, f, indent=1)
            runs, largest = searches[key]
            for run in runs:
                if run["trained"]:
                    predicted = estimate(args, strategy, run["model"], checkpointing)
                    measured = run["measured_mib"]
                    points.append({"strategy": strategy[0], "ac": "full" if checkpointing else "none",
                                   "model": run["model"], "predicted": max(predicted), "measured": max(measured),
                                   "error": 100 * (max(predicted) - max(measured)) / max(measured),
                                   "predicted_ranks": predicted, "measured_ranks": measured})
            row = {"strategy": strategy[0], "ac": "full" if checkpointing else "none"}
            if largest >= 0:
                name = FAMILY[largest][0]
                point = next(p for p in points if p["strategy"] == strategy[0] and p["model"] == name and
                             p["ac"] == row["ac"])
                row.update(model=name, parameters=params[name] / 1e6, predicted=point["predicted"],
                           measured=point["measured"])
            else:
                row.update(model="none")
            tried_above = [r["model"] for r in runs if not r["trained"]]
            row["next"] = tried_above[-1] if tried_above else "(the family's largest)"
            rows.append(row)
            start = max(largest, 0)
            if checkpointing:  # the next strategy starts from this one's largest without checkpointing
                start = max(searches[f"{strategy[0]}|False"][1], 0)
    budget = f"{args.budget} per device, global batch {args.batch_size}, SGD with momentum, 2 steps"
    doc = results_file.document(
        f"The largest ResNet each strategy trains ({budget})", "largest_model.py",
        [{"key": "strategy", "title": "strategy"}, {"key": "ac", "title": "activation checkpointing"},
         {"key": "model", "title": "largest model that trains"},
         {"key": "parameters", "title": "parameters (M)", "format": ".1f"},
         {"key": "predicted", "title": "predicted peak, MiB (--estimate-memory)", "format": ".1f"},
         {"key": "measured", "title": "measured peak, MiB (max_memory_allocated)", "format": ".1f"},
         {"key": "next", "title": "the next one up: out of memory"}],
        rows, [], started, conditions="Peaks are the largest of the ranks'.")
    doc["budget"] = args.budget
    doc["family"] = FAMILY
    doc["points"] = points
    if args.out:
        results_file.write(args.out, doc)
    if args.points:
        errors = [abs(p["error"]) for p in points]
        results_file.write(args.points, results_file.document(
            f"--estimate-memory against measured max_memory_allocated, every run of the largest-model search "
            f"({budget})", "largest_model.py",
            [{"key": "strategy", "title": "strategy"}, {"key": "ac", "title": "activation checkpointing"},
             {"key": "model", "title": "model"}, {"key": "predicted", "title": "predicted peak, MiB", "format": ".1f"},
             {"key": "measured", "title": "measured peak, MiB", "format": ".1f"},
             {"key": "error", "title": "error %", "format": "+.1f"}],
            points, [{"name": "largest |error| %", "value": max(errors), "format": ".1f"}], started,
            conditions="Peaks are the largest of the ranks'."))
    if args.chart:
        draw(doc, args.chart)


def draw(doc, path):
    import plotting  # bench/plotting.py: matplotlib, installed on demand
    plt = plotting.pyplot()
    rows = doc["rows"]
    names = [r["strategy"] for r in rows if r["ac"] == "none"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1.25, 1]})
    for k, (ac, colour) in enumerate((("none", "#4c72b0"), ("full", "#dd8452"))):
        ys = [i + (0.2 if k == 0 else -0.2) for i in range(len(names))]
        values = [next((r.get("parameters", 0) for r in rows if r["strategy"] == n and r["ac"] == ac), 0)
                  for n in names]
        left.barh(ys, values, height=0.38, color=colour,
                  label="without activation checkpointing" if ac == "none" else "with (every block)")
        for y, n, v in zip(ys, names, values):
            model = next(r["model"] for r in rows if r["strategy"] == n and r["ac"] == ac)
            left.text(v + 1, y, model, va="center", fontsize=7)
    left.set_yticks(range(len(names)))
    left.set_yticklabels(names)
    left.invert_yaxis()
    left.set_xlabel("parameters of the largest model that trains (millions)")
    left.set_xlim(0, 160)
    left.legend(loc="upper right", fontsize=8)
    left.set_title(f"Largest trainable ResNet at {doc['budget']} per device", fontsize=10)
    pts = doc["points"]
    for ac, marker in (("none", "o"), ("full", "^")):
        sel = [p for p in pts if p["ac"] == ac]
        right.scatter([p["measured"] for p in sel], [p["predicted"] for p in sel], marker=marker, s=22,
                      label="without activation checkpointing" if ac == "none" else "with")
    top = max(max(p["measured"], p["predicted"]) for p in pts) * 1.05
    right.plot([0, top], [0, top], color="grey", linewidth=0.8, label="prediction = measurement")
    right.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.12, label="within 10%")
    right.set_xlim(0, top)
    right.set_ylim(0, top)
    right.set_xlabel("measured peak, MiB (max_memory_allocated, largest rank)")
    right.set_ylabel("predicted peak, MiB (--estimate-memory)")
    right.set_title("The estimator beside every run that trained", fontsize=10)
    right.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{doc['title']}; {doc['machine']['cpu']}, commit {doc['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.savefig(os.path.splitext(path)[0] + ".svg")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
