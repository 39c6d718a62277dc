#!/usr/bin/env python3
"""Time to 94% on CIFAR-10: the airbench94 recipe trained by loom (build/examples/airbench)
and by PyTorch 1.13 (bench/airbench_torch.py), seed by seed, on the same CPU threads.

    meson compile -C build examples/airbench parallel/loomrun
    python3 bench/time_to_accuracy.py --runs 10 --threads 2             # loom and PyTorch, 10 seeds each
    python3 bench/time_to_accuracy.py --runs 10 --ddp-runs 5            # and loom DDP, 2 processes x 1 thread
    python3 bench/time_to_accuracy.py --runs 10 --dry-run               # the commands, without running them
    python3 bench/time_to_accuracy.py --aggregate-only                  # the results file and chart, from the runs kept
    python3 bench/report.py                                             # the table in docs/ from the results file

A run trains the whole recipe from one seed (476 steps of batch 1024, 9.9 epochs) and tests
it with test-time augmentation; its figure is the wall clock of whitening + training + the
final evaluation (reading the data is not timed) and the TTA accuracy it reached. The runs
interleave, seed 0 loom, seed 0 PyTorch, (seed 0 loom DDP,) seed 1 loom, ..., so that both
frameworks see the same machine over the hours it takes; both run single-process with
--threads threads (PyTorch with glibc's malloc tuned, as bench_train's "torch tuned"), loom
DDP as build/parallel/loomrun --standalone --nproc_per_node 2 with one thread per process.

A run takes 10 to 70 minutes on 2 cores, so a series outlasts a session: every run's figures
(the --metrics-json both programs write) are kept in --state, one file per framework, mode
and seed, outside the repository (default ~/.cache/loom/time_to_94/), beside its output log.
Started again, the script skips the runs already there. After every run it rewrites
bench/results/time_to_94.json from all the runs kept (an interrupted series still leaves a
valid file) and draws docs/img/time_to_94.png. The file's rows give, per framework and mode,
the runs, the TTA accuracy (mean, standard deviation, range, runs at 94% or more) and the
medians of the wall time, its phases and the peak RSS; its ratios give PyTorch's wall time
over loom's (the median over seeds both ran, and the ratio of the medians) and the p-value of
Welch's two-sample t-test of the mean accuracies (standard library only: no scipy).
"""
import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
from airbench_torch import TOTAL_STEPS, TUNED, find_data, write_json  # noqa: E402  (imports no torch)

ROOT = results_file.ROOT
DEFAULT_STATE = os.path.join(os.path.expanduser("~"), ".cache", "loom", "time_to_94")
DEFAULT_OUT = os.path.join(ROOT, "bench", "results", "time_to_94.json")
DEFAULT_CHART = os.path.join(ROOT, "docs", "img", "time_to_94.png")
REDRAW = "python3 bench/time_to_accuracy.py --chart-from bench/results/time_to_94.json"
TARGET = 94.0

# kind -> (framework in the metrics, processes, the state file's prefix, colour in the chart)
KINDS = {"loom": ("loom", 1, "loom", "tab:blue"),
         "torch": ("pytorch", 1, "pytorch", "tab:orange"),
         "ddp": ("loom", 2, "loom-ddp", "tab:green")}
REQUIRED = ("framework", "seed", "threads", "processes", "steps", "tta_accuracy", "wall_time_s", "phases_s")
PHASES = ("whitening", "train", "data", "lookahead", "tta")


# ------------------------------------------------------------------------------ statistics

def _betacf(a, b, x):
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom (df may be fractional)."""
    return betainc(df / 2, 0.5, df / (df + t * t))


def welch(xs, ys):
    """(t, degrees of freedom, two-sided p) of Welch's unequal-variance t-test, or None."""
    if len(xs) < 2 or len(ys) < 2:
        return None
    vx, vy = statistics.variance(xs) / len(xs), statistics.variance(ys) / len(ys)
    diff = statistics.fmean(xs) - statistics.fmean(ys)
    if vx + vy == 0:
        return (0.0 if diff == 0 else math.copysign(math.inf, diff)), math.inf, (1.0 if diff == 0 else 0.0)
    t = diff / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(xs) - 1) + vy ** 2 / (len(ys) - 1))
    return t, df, t_two_sided_p(t, df)


# ---------------------------------------------------------------------------------- running

def state_name(kind, seed, steps):
    return f"{KINDS[kind][2]}-seed{seed}" + ("" if steps == TOTAL_STEPS else f"-steps{steps}")


def command(a, kind, seed, data, metrics):
    common = ["--data", data, "--seed", str(seed)]
    steps = [] if a.steps == TOTAL_STEPS else ["--max-steps", str(a.steps)]
    if kind == "torch":
        return ([a.torch_python, "bench/airbench_torch.py", *common, "--threads",
                 str(a.threads), "--metrics-json", metrics, *steps, *shlex.split(a.torch_args)],
                {"GLIBC_TUNABLES": TUNED, "OMP_NUM_THREADS": str(a.threads)})
    loom = [*shlex.split(a.loom), *common, "--conv-benchmark", a.conv_benchmark]
    extra = [*steps, *shlex.split(a.loom_args)]
    if kind == "loom":
        return [*loom, "--threads", str(a.threads), "--metrics-json", metrics, *extra], \
            {"OMP_NUM_THREADS": str(a.threads)}
    return [*shlex.split(a.loomrun), "--standalone", "--nproc_per_node", "2", *loom, "--threads", "1",
            "--metrics-json", metrics, *extra], {"OMP_NUM_THREADS": "1"}


def schedule(a):
    """(kind, seed) in the interleaved order: per seed loom, PyTorch, loom DDP."""
    counts = {"loom": a.runs, "torch": a.torch_runs, "ddp": a.ddp_runs}
    if a.only:
        counts = {k: (n if k == a.only else 0) for k, n in counts.items()}
    return [(kind, a.seed_base + i) for i in range(max(counts.values(), default=0))
            for kind in ("loom", "torch", "ddp") if i < counts[kind]]


def run_one(a, kind, seed, data, index, total):
    name = state_name(kind, seed, a.steps)
    final = os.path.join(a.state, name + ".json")
    partial = os.path.join(a.state, name + ".partial.json")
    cmd, env_changes = command(a, kind, seed, data, partial)
    shown = " ".join(f"{k}={v}" for k, v in env_changes.items()) + " " + shlex.join(cmd)  # run from the repository
    if os.path.exists(final):
        print(f"[{index}/{total}] {name}: kept from an earlier session ({final})", flush=True)
        return False
    print(f"[{index}/{total}] {name}: {shown}", flush=True)
    if a.dry_run:
        return False
    program = cmd[0]
    if not (os.path.exists(os.path.join(ROOT, program)) or shutil.which(program)):
        sys.exit(f"time_to_accuracy: {program} does not exist; build it: meson compile -C build examples/airbench "
                 "parallel/loomrun")
    os.makedirs(a.state, exist_ok=True)
    if os.path.exists(partial):
        os.remove(partial)
    # The commit the run was built from: taken at its start, since commits may land while it runs.
    started, commit, t0 = results_file.now(), results_file.commit(), time.perf_counter()
    log_path = os.path.join(a.state, name + ".log")
    with open(log_path, "w") as log:
        log.write(f"# {started}\n# {shown}\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                env=dict(os.environ, **env_changes), bufsize=1)
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if not a.quiet:
                print(f"    {line}", end="", flush=True)
        rc = proc.wait()
    if rc != 0 or not os.path.exists(partial):
        with open(log_path) as f:
            tail = f.read()[-3000:]
        sys.exit(f"time_to_accuracy: {name} failed (exit {rc}{', no metrics written' if rc == 0 else ''}); "
                 f"its output is in {log_path}:\n{tail}")
    with open(partial) as f:
        metrics = json.load(f)
    missing = [k for k in REQUIRED if k not in metrics]
    framework, processes = KINDS[kind][:2]
    if missing or metrics["framework"] != framework or int(metrics["processes"]) != processes:
        sys.exit(f"time_to_accuracy: {partial} is not a {framework} run of {processes} process(es) "
                 f"(missing {missing}, framework {metrics.get('framework')}, processes {metrics.get('processes')})")
    metrics.update({"kind": kind, "command": shown.strip(), "commit": commit, "date": started,
                    "elapsed_s": time.perf_counter() - t0})
    write_json(final, metrics)
    os.remove(partial)
    print(f"[{index}/{total}] {name}: TTA accuracy {100 * metrics['tta_accuracy']:.2f}%, wall time "
          f"{metrics['wall_time_s']:.1f} s; kept in {final}", flush=True)
    return True


# ------------------------------------------------------------------------------ aggregation

def load_runs(state, steps):
    runs = []
    if not os.path.isdir(state):
        return runs
    for name in sorted(os.listdir(state)):
        if not name.endswith(".json") or name.endswith(".partial.json"):
            continue
        with open(os.path.join(state, name)) as f:
            run = json.load(f)
        if run.get("kind") in KINDS and int(run.get("steps", -1)) == steps:
            runs.append(run)
    return sorted(runs, key=lambda r: (r["seed"], list(KINDS).index(r["kind"])))


def plural(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"


def label(kind, runs):
    threads = "/".join(str(t) for t in sorted({r["threads"] for r in runs}))
    if kind == "torch":
        # major.minor only: Debian 12's python3-torch 1.13.1 reports itself as 1.13.0a0, and
        # the pages name one version for one package (docs/benchmarks.md).
        versions = "/".join(sorted({".".join(r.get("version", "1.13").split(".")[:2]) for r in runs}))
        return f"PyTorch {versions}, {threads} threads (malloc tuned)"
    if kind == "ddp":
        return f"loom DDP, 2 processes x {threads} thread{'s' if threads != '1' else ''}"
    return f"loom, {threads} threads"


COLUMNS = [
    {"key": "framework", "title": "framework"},
    {"key": "n", "title": "runs"},
    {"key": "acc_mean", "title": "TTA accuracy mean (%)", "format": ".2f"},
    {"key": "acc_std", "title": "std", "format": ".2f"},
    {"key": "acc_min", "title": "min", "format": ".2f"},
    {"key": "acc_max", "title": "max", "format": ".2f"},
    {"key": "reached", "title": "runs >= 94%"},
    {"key": "wall_s", "title": "wall time, median (s)", "format": ".1f"},
    {"key": "whitening_s", "title": "whitening (s)", "format": ".2f"},
    {"key": "train_s", "title": "training (s)", "format": ".1f"},
    {"key": "data_s", "title": "of it augmentation (s)", "format": ".1f"},
    {"key": "lookahead_s", "title": "of it lookahead (s)", "format": ".1f"},
    {"key": "tta_s", "title": "TTA test (s)", "format": ".1f"},
    {"key": "rss_mib", "title": "peak RSS, median (MiB)", "format": ".0f"},
    {"key": "plain_acc_mean", "title": "one-view accuracy mean (%)", "format": ".2f"},
]


def row(kind, runs):
    acc = [100 * r["tta_accuracy"] for r in runs]
    med = lambda values: statistics.median(values) if values else None  # noqa: E731
    out = {"framework": label(kind, runs), "kind": kind, "n": len(runs), "acc_mean": statistics.fmean(acc),
           "acc_std": statistics.stdev(acc) if len(acc) > 1 else None, "acc_min": min(acc), "acc_max": max(acc),
           "reached": f"{sum(a >= TARGET for a in acc)}/{len(acc)}",
           "fraction_reached": sum(a >= TARGET for a in acc) / len(acc),
           "wall_s": med([r["wall_time_s"] for r in runs]),
           "rss_mib": med([r["peak_rss_mib"] for r in runs if r.get("peak_rss_mib") is not None]),
           "plain_acc_mean": statistics.fmean([100 * r["accuracy"] for r in runs if "accuracy" in r])
           if any("accuracy" in r for r in runs) else None}
    for phase in PHASES:
        out[f"{phase}_s"] = med([r["phases_s"][phase] for r in runs if phase in r.get("phases_s", {})])
    return out


def ratios_of(by_kind):
    ratios = []
    wall = {k: {r["seed"]: r["wall_time_s"] for r in runs} for k, runs in by_kind.items()}
    acc = {k: [100 * r["tta_accuracy"] for r in runs] for k, runs in by_kind.items()}
    names = {"loom": "loom's", "ddp": "loom DDP's", "torch": "PyTorch's"}
    for slow, fast in (("torch", "loom"), ("torch", "ddp"), ("loom", "ddp")):
        if slow not in wall or fast not in wall:
            continue
        seeds = sorted(set(wall[slow]) & set(wall[fast]))
        if seeds:
            pairs = statistics.median(wall[slow][s] / wall[fast][s] for s in seeds)
            ratios.append({"name": f"{names[slow]} wall time / {names[fast]}, median over the "
                                   f"{plural(len(seeds), 'seed')} both ran", "value": pairs})
        ratios.append({"name": f"{names[slow]} median wall time / {names[fast]}", "value":
                       statistics.median(wall[slow].values()) / statistics.median(wall[fast].values())})
    for a_kind, b_kind in (("loom", "torch"), ("ddp", "torch")):
        if a_kind in acc and b_kind in acc:
            test = welch(acc[a_kind], acc[b_kind])
            if test:
                t, df, p = test
                ratios.append({"name": f"Welch's t-test of the mean TTA accuracy, {names[a_kind][:-2]} "
                                       f"{statistics.fmean(acc[a_kind]):.2f}% (n = {len(acc[a_kind])}) against "
                                       f"PyTorch {statistics.fmean(acc[b_kind]):.2f}% (n = {len(acc[b_kind])}): "
                                       f"t = {t:.2f}, {df:.1f} degrees of freedom; two-sided p",
                               "value": p, "format": ".3g"})
    return ratios


def canonical_command(by_kind, a):
    n = {k: len(v) for k, v in by_kind.items()}
    parts = [f"--runs {n.get('loom', 0)}"]
    if n.get("torch", 0) != n.get("loom", 0):
        parts.append(f"--torch-runs {n.get('torch', 0)}")
    if n.get("ddp"):
        parts.append(f"--ddp-runs {n['ddp']}")
    threads = sorted({r["threads"] for k in ("loom", "torch") for r in by_kind.get(k, [])})
    parts.append(f"--threads {threads[0] if len(threads) == 1 else a.threads}")
    if a.steps != TOTAL_STEPS:
        parts.append(f"--steps {a.steps}")
    return "python3 bench/time_to_accuracy.py " + " ".join(parts)


def aggregate(a, started, plt):
    runs = load_runs(a.state, a.steps)
    if not runs:
        print(f"no runs of {a.steps} steps in {a.state} yet: nothing to aggregate", flush=True)
        return None
    by_kind = {k: [r for r in runs if r["kind"] == k] for k in KINDS}
    by_kind = {k: v for k, v in by_kind.items() if v}
    rows = [row(k, v) for k, v in by_kind.items()]
    ratios = ratios_of(by_kind)
    steps = "" if a.steps == TOTAL_STEPS else f", first {a.steps} of {TOTAL_STEPS} steps only"
    title = (f"Time to 94% on CIFAR-10, the airbench94 recipe (batch 1024, {TOTAL_STEPS} steps, test-time "
             f"augmentation){steps}: loom against PyTorch 1.13 on the CPU, one run per seed, interleaved")
    doc = results_file.document(title, "time_to_accuracy.py", COLUMNS, rows, ratios, started, a.conditions)
    doc["command"] = canonical_command(by_kind, a)
    commits = sorted({r.get("commit", "?") for r in runs})
    doc["run_commits"] = commits
    doc["runs"] = [{"framework": r["framework"], "kind": r["kind"], "processes": r["processes"], "seed": r["seed"],
                    "threads": r["threads"], "wall_time_s": r["wall_time_s"], "tta_accuracy": r["tta_accuracy"],
                    "accuracy": r.get("accuracy"), "commit": r.get("commit"), "date": r.get("date")} for r in runs]
    results_file.write(a.out, doc)
    for r in rows:
        print(f"  {r['framework']}: {plural(r['n'], 'run')}, TTA accuracy {r['acc_mean']:.2f}% "
              f"(min {r['acc_min']:.2f}, max {r['acc_max']:.2f}, {r['reached']} at 94%), "
              f"median wall time {r['wall_s']:.1f} s", flush=True)
    for ratio in ratios:
        print(f"  {ratio['name']}: {format(ratio['value'], ratio.get('format', '.2f'))}", flush=True)
    if plt is not None:
        draw(plt, doc, by_kind, a.chart)
    return doc


def draw(plt, doc, by_kind, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, runs in by_kind.items():
        colour = KINDS[kind][3]
        minutes = [r["wall_time_s"] / 60 for r in runs]
        acc = [100 * r["tta_accuracy"] for r in runs]
        med_t, med_a = statistics.median(minutes), statistics.median(acc)
        ax.scatter(minutes, acc, s=22, color=colour, alpha=0.7,
                   label=f"{label(kind, runs)}: {plural(len(runs), 'run')}, median {med_t:.1f} min, {med_a:.2f}%")
        ax.scatter([med_t], [med_a], s=140, marker="D", facecolor="none", edgecolor=colour, linewidth=2)
    ax.set_xlim(left=0)
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, TARGET - 0.1), max(high, TARGET + 0.1))  # the 94% line always in view
    ax.axhline(TARGET, color="0.3", linestyle="--", linewidth=1)
    ax.text(0, TARGET, " 94%", va="bottom", ha="left", fontsize=8, color="0.3")
    ax.set_xlabel("wall time: whitening + training + TTA test (minutes)")
    ax.set_ylabel("TTA test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), title="diamond: the median of each",
              title_fontsize=7, frameon=False)
    ax.set_title(f"airbench94 on CIFAR-10: each run, loom against PyTorch\n{doc['machine']['cpu']}, "
                 "{} cores, commit {}; redraw: {}".format(doc["machine"]["cores"], results_file.commit_hash(doc["commit"]),
                                                           REDRAW), fontsize=8)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote {path} ({os.path.getsize(path) // 1024} KB)", flush=True)


# ------------------------------------------------------------------------------------- main

CURVE_COLUMNS = [
    {"key": "epoch", "title": "epoch"},
    {"key": "steps", "title": "steps"},
    {"key": "train_loss", "title": "train loss (per example)", "format": ".4f"},
    {"key": "test_acc", "title": "test acc, one view (%)", "format": ".2f"},
    {"key": "elapsed_s", "title": "timed seconds so far", "format": ".1f"},
]


def write_curve(a):
    """The per-epoch rows of one kept run, and its final TTA accuracy as the last row."""
    with open(os.path.expanduser(a.curve)) as f:
        run = json.load(f)
    epochs = run.get("per_epoch", [])
    if not epochs or "accuracy" not in epochs[0]:
        sys.exit(f"{a.curve}: no per-epoch test accuracy; make the run with --eval-every-epoch")
    steps, rows = 0, []
    for e in epochs:
        steps += e["steps"]
        rows.append({"epoch": e["epoch"] + 1, "steps": steps,  # counted from 1, as the programs print it "train_loss": e["train_loss"],
                     "test_acc": 100 * e["accuracy"], "elapsed_s": e["elapsed_s"]})
    rows.append({"epoch": "end (6-view TTA)", "steps": run["steps"], "test_acc": 100 * run["tta_accuracy"],
                 "elapsed_s": run["wall_time_s"]})
    title = (f"{run['framework']}'s airbench94 run, seed {run['seed']}, {run['threads']} threads, tested after every "
             f"epoch (untimed) and with TTA at the end")
    doc = results_file.document(title, "time_to_accuracy.py", CURVE_COLUMNS, rows, [], results_file.now(),
                                a.conditions)
    doc["commit"] = run.get("commit", doc["commit"])
    doc["date"] = run.get("date", doc["date"])
    results_file.write(a.curve_out, doc)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=0, help="loom runs, single process (seeds seed-base, ...)")
    p.add_argument("--torch-runs", type=int, help="PyTorch runs (default: --runs)")
    p.add_argument("--ddp-runs", type=int, default=0, help="loom DDP runs, 2 processes x 1 thread")
    p.add_argument("--threads", type=int, default=2, help="threads of the single-process runs")
    p.add_argument("--seed-base", type=int, default=0)
    p.add_argument("--only", choices=["loom", "torch", "ddp"], help="run this kind only (all kept runs aggregate)")
    p.add_argument("--steps", type=int, default=TOTAL_STEPS,
                   help=f"steps per run, passed to both programs (default the recipe's {TOTAL_STEPS}; fewer for "
                        "smoke runs, kept and aggregated apart from full runs)")
    p.add_argument("--data", help="CIFAR-10 folder (default: as loom finds it: $LOOM_DATA, data/, ../shared/data/)")
    p.add_argument("--state", default=DEFAULT_STATE, help="where each run's figures are kept (outside the repository)")
    p.add_argument("--out", default=DEFAULT_OUT, help="the results file")
    p.add_argument("--chart", default=DEFAULT_CHART, help="the chart (PNG)")
    p.add_argument("--no-chart", action="store_true")
    p.add_argument("--loom", default="build/examples/airbench",
                   help="loom's airbench program, from the repository (a command line: words split as by a shell)")
    p.add_argument("--loomrun", default="build/parallel/loomrun", help="the launcher of the DDP runs")
    p.add_argument("--torch-python", default="/usr/bin/python3", help="a python with torch (Debian's python3-torch)")
    p.add_argument("--conv-benchmark", choices=["on", "off"], default="off",
                   help="loom's kernel search (Note [Kernel autotuning]); off by default, as the series in "
                        "bench/results/time_to_94.json ran: on its AMD EPYC the search gains 1.04-1.08x a step "
                        "for ~24 s once (bench/results/conv_benchmark.json)")
    p.add_argument("--loom-args", default="", help="more arguments for loom's airbench")
    p.add_argument("--torch-args", default="", help="more arguments for bench/airbench_torch.py")
    p.add_argument("--conditions", default="", help="how quiet the machine was, for the results file")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--aggregate-only", action="store_true", help="rebuild the results file and chart from --state")
    p.add_argument("--chart-from", metavar="RESULTS_JSON",
                   help="redraw only the chart (--chart) from a results file's runs, without the kept runs")
    p.add_argument("--quiet", action="store_true", help="keep the programs' output in the logs only")
    p.add_argument("--curve", metavar="RUN_JSON",
                   help="instead of running: one run's per-epoch figures (a run made with --eval-every-epoch, "
                        "e.g. ~/.cache/loom/time_to_94/loom-seed0.json) as the results file --curve-out")
    p.add_argument("--curve-out", default=os.path.join(ROOT, "bench", "results", "speedrun_curve.json"))
    a = p.parse_args()
    if a.curve:
        return write_curve(a)
    a.torch_runs = a.runs if a.torch_runs is None else a.torch_runs
    a.state = os.path.abspath(os.path.expanduser(a.state))
    if os.path.commonpath([a.state, ROOT]) == ROOT:
        p.error(f"--state {a.state} is inside the repository; keep the runs outside it")
    if not 0 < a.steps <= TOTAL_STEPS:
        p.error(f"--steps must be in 1..{TOTAL_STEPS}")
    plt = None
    if not a.no_chart and not a.dry_run:
        import plotting  # bench/plotting.py: matplotlib, installed on demand (before any long work)
        plt = plotting.pyplot()
    if a.chart_from:  # the runs a results file keeps (doc["runs"]) are what the chart plots
        with open(a.chart_from) as f:
            doc = json.load(f)
        by_kind = {kind: [r for r in doc["runs"] if r["kind"] == kind] for kind in KINDS}
        draw(plt, doc, {kind: runs for kind, runs in by_kind.items() if runs}, a.chart)
        return 0
    started = results_file.now()
    if not a.aggregate_only:
        order = schedule(a)
        data = find_data(a.data)
        print(f"{plural(len(order), 'run')} in order, {a.steps} steps each; kept in {a.state}; data {data}", flush=True)
        ran = 0
        for index, (kind, seed) in enumerate(order, 1):
            if run_one(a, kind, seed, data, index, len(order)):
                ran += 1
                aggregate(a, started, plt)  # after every run: an interrupted series leaves a valid file
        if a.dry_run or ran:
            return 0
    aggregate(a, started, plt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
