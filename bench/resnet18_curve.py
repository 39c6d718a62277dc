#!/usr/bin/env python3
"""ResNet18 on CIFAR-10 to 94%: the results file and picture of one run of the recipe that
scripts/resnet18_94.sh starts (and resumes) in a folder of its own.

    scripts/resnet18_94.sh RUN_DIR --data D                 # the run, in the background (hours)
    python3 bench/resnet18_curve.py RUN_DIR                 # bench/results/resnet18_curve.json + docs/img/resnet18_curve.png
    python3 bench/resnet18_curve.py --chart-from bench/results/resnet18_curve.json   # the picture alone
    python3 bench/report.py                                 # the tables in docs/ from the results file

It reads RUN_DIR/COMMAND, log.txt (train_cifar10's epoch lines, every start and resume with
the step it resumed from), COMMIT, load.txt (the load average each minute) and, once the run
has ended, tta.txt (the six-view evaluation of the saved weights and their sha256). The file
has one row per epoch -- train loss and accuracy, one-view test loss and accuracy, the
epoch's wall time and images per second, the load average while it ran -- and, at the end,
the six-view (TTA) accuracy. `--clean-img-per-s` gives the throughput of the same step on an
otherwise idle machine (bench_train, or the run's first steps alone), from which the wall
time of an undisturbed run is estimated.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

ROOT = results_file.ROOT
DEFAULT_OUT = os.path.join(ROOT, "bench", "results", "resnet18_curve.json")
DEFAULT_CHART = os.path.join(ROOT, "docs", "img", "resnet18_curve.png")
REDRAW = "python3 bench/resnet18_curve.py --chart-from bench/results/resnet18_curve.json"
TARGET = 94.0
COLUMNS = [{"key": "epoch", "title": "epoch"},
           {"key": "train_loss", "title": "train loss", "format": ".4f"},
           {"key": "train_acc", "title": "train acc %", "format": ".2f"},
           {"key": "test_loss", "title": "test loss", "format": ".4f"},
           {"key": "test_acc", "title": "test acc % (one view)", "format": ".2f"},
           {"key": "tta_acc", "title": "test acc % (six views)", "format": ".2f"},
           {"key": "time_s", "title": "wall s", "format": ".0f"},
           {"key": "img_per_s", "title": "img/s", "format": ".1f"},
           {"key": "load", "title": "load average", "format": ".2f"}]

EPOCH = re.compile(r"^epoch (\d+)/(\d+)  train loss ([\d.]+)  train acc ([\d.]+)%  test loss ([\d.]+)  test acc "
                   r"([\d.]+)%  time ([\d.]+)s  ([\d.]+) img/s")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) (starting|resuming|exit)")
RESUMED = re.compile(r"^resumed from (\S+)(?: \([^)]*\))? at epoch (\d+), step (\d+)")
TTA = re.compile(r"^eval: tta test loss ([\d.]+)  tta test acc ([\d.]+)% \((\d+) images\)")


def parse_time(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)


def read_lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def load_between(samples, start, end):
    """The mean 1-minute load average of the samples taken in [start, end]."""
    inside = [load for t, load in samples if start <= t <= end]
    return round(statistics.mean(inside), 2) if inside else None


def collect(run_dir):
    """The results document of the run in run_dir."""
    log = read_lines(os.path.join(run_dir, "log.txt"))
    samples = []
    for line in read_lines(os.path.join(run_dir, "load.txt")):
        parts = line.split()
        if len(parts) >= 2:
            samples.append((parse_time(parts[0]), float(parts[1])))
    epochs, segments, resumes = {}, [], []
    cursor = None  # where the next epoch line's epoch began: the start of its segment, or the last epoch's end
    for line in log:
        if m := STAMP.match(line):
            when = parse_time(m.group(1))
            if m.group(2) in ("starting", "resuming"):
                segments.append({"start": when, "kind": m.group(2)})
                cursor = when
            elif segments:
                segments[-1]["end"] = when
        elif m := RESUMED.match(line):
            resumes.append({"at": segments[-1]["start"].strftime("%Y-%m-%d %H:%M UTC") if segments else None,
                            "epoch": int(m.group(2)), "step": int(m.group(3))})
        elif m := EPOCH.match(line):
            epoch, seconds = int(m.group(1)), float(m.group(7))
            # A resumed epoch prints once, when it ends: its time is the resumed part's alone.
            end = cursor + datetime.timedelta(seconds=seconds) if cursor else None
            epochs[epoch] = {"epoch": epoch, "train_loss": float(m.group(3)), "train_acc": float(m.group(4)),
                             "test_loss": float(m.group(5)), "test_acc": float(m.group(6)),
                             "time_s": seconds, "img_per_s": float(m.group(8)),
                             "load": load_between(samples, cursor, end) if cursor else None,
                             "planned": int(m.group(2))}
            cursor = end
    rows = [epochs[epoch] for epoch in sorted(epochs)]
    tta = None
    tta_lines = read_lines(os.path.join(run_dir, "tta.txt"))
    for line in tta_lines:
        if m := TTA.match(line):
            tta = {"test_loss": float(m.group(1)), "test_acc": float(m.group(2)), "images": int(m.group(3))}
    sha = next((line.split()[0] for line in tta_lines if re.match(r"^[0-9a-f]{64} ", line)), None)
    command = " ".join(read_lines(os.path.join(run_dir, "COMMAND")))
    commits = [line for line in read_lines(os.path.join(run_dir, "COMMIT")) if line.strip()]
    mean_load = round(statistics.mean(load for _, load in samples), 2) if samples else None
    return {"rows": rows, "tta": tta, "sha256": sha, "command": command, "commits": commits, "resumes": resumes,
            "mean_load": mean_load, "segments": [{k: (v.strftime("%Y-%m-%d %H:%M UTC") if isinstance(v, datetime.datetime)
                                                      else v) for k, v in s.items()} for s in segments]}


def document(run_dir, clean_img_per_s):
    run = collect(run_dir)
    rows = [dict(r, tta_acc=None) for r in run["rows"]]
    if rows and run["tta"]:  # the six views evaluate the saved weights: the last epoch's
        rows[-1]["tta_acc"] = run["tta"]["test_acc"]
    planned = rows[-1]["planned"] if rows else None
    wall = sum(r["time_s"] for r in rows)
    doc = results_file.document(
        "ResNet18 on CIFAR-10: the 94% recipe under DDP, epoch by epoch", "resnet18_curve.py",
        COLUMNS, [{column["key"]: r[column["key"]] for column in COLUMNS} for r in rows], {}, results_file.now(),
        conditions="2 processes x 1 thread (loomrun, --mode ddp), batch 512; test accuracy one view per epoch, "
                   "six views (TTA) at the end; the machine's load average beside each figure (the 2 cores were "
                   "shared with other programs where it is well above 2); a resumed epoch's wall time and img/s are "
                   "its resumed part's.")
    doc["command"] = "python3 bench/resnet18_curve.py RUN_DIR"
    doc["run_command"] = run["command"]
    doc["run_commits"] = run["commits"]
    doc["resumes"] = run["resumes"]
    doc["segments"] = run["segments"]
    doc["mean_load"] = run["mean_load"]
    doc["epochs_planned"] = planned
    doc["epochs_done"] = len(rows)
    doc["wall_time_s"] = round(wall, 1)
    doc["final"] = {"one_view_acc": rows[-1]["test_acc"] if rows else None,
                    "tta_acc": run["tta"]["test_acc"] if run["tta"] else None,
                    "weights_sha256": run["sha256"], "reached_target": bool(run["tta"] and run["tta"]["test_acc"] >= TARGET)}
    if clean_img_per_s:
        doc["clean_img_per_s"] = clean_img_per_s
        doc["quiet_wall_time_s"] = round((planned or len(rows)) * 50000 / clean_img_per_s, 0)
    return doc


def draw(doc, chart):
    from plotting import pyplot
    plt = pyplot()
    rows = doc["rows"]
    x = [r["epoch"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    left.plot(x, [r["test_acc"] for r in rows], "o-", label="test, one view")
    left.plot(x, [r["train_acc"] for r in rows], "s--", label="train (augmented)")
    tta = doc.get("final", {}).get("tta_acc")
    if tta is not None:
        left.plot([x[-1]], [tta], "r*", markersize=12, label=f"test, six views: {tta:.2f}%")
    left.axhline(TARGET, color="grey", linewidth=0.8, linestyle=":", label=f"{TARGET:.0f}%")
    left.set_xlabel("epoch")
    left.set_ylabel("accuracy (%)")
    left.set_ylim(30, 100)
    left.legend(loc="lower right", fontsize=8)
    right.plot(x, [r["train_loss"] for r in rows], "s--", label="train (label-smoothed)")
    right.plot(x, [r["test_loss"] for r in rows], "o-", label="test")
    right.set_xlabel("epoch")
    for axis in (left, right):
        axis.set_xticks(x)
    right.set_ylabel("cross-entropy")
    right.legend(fontsize=8)
    fig.suptitle(f"ResNet18 on CIFAR-10, {doc['epochs_done']} of {doc['epochs_planned']} epochs "
                 f"(DDP, 2 processes, {doc['machine']['cpu']} {doc['machine']['isa']})", fontsize=10)
    fig.text(0.01, 0.01, f"redraw: {REDRAW}", fontsize=6, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    os.makedirs(os.path.dirname(chart), exist_ok=True)
    fig.savefig(chart, dpi=80)
    print(f"drew {chart}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", nargs="?", help="the folder scripts/resnet18_94.sh ran in")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--chart", default=DEFAULT_CHART)
    p.add_argument("--chart-from", help="draw the picture from this results file alone")
    p.add_argument("--clean-img-per-s", type=float, default=0.0,
                   help="the recipe's training images per second on an idle machine (bench_train)")
    a = p.parse_args()
    if a.chart_from:
        with open(a.chart_from) as f:
            draw(json.load(f), a.chart)
        return
    if not a.run_dir or not os.path.isfile(os.path.join(a.run_dir, "log.txt")):
        sys.exit(f"resnet18_curve: expected the folder of a run of scripts/resnet18_94.sh (with log.txt), got "
                 f"{a.run_dir!r}")
    doc = document(a.run_dir, a.clean_img_per_s)
    if not doc["rows"]:
        sys.exit(f"resnet18_curve: {a.run_dir}/log.txt has no finished epoch yet")
    results_file.write(a.out, doc)
    draw(doc, a.chart)


if __name__ == "__main__":
    main()
