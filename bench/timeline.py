"""One training step of loom's own trace as a picture: a row per thread, device, stage or
rank and a row per communication track, spans coloured by what they are, and per row how
busy it was, its bubble and, for communication, how much of it hid under computation.

    LOOM_TRACE=/tmp/ddp.json build/parallel/loomrun --standalone --nproc_per_node 2 \\
        build/examples/train_cifar10 --mode ddp --synthetic --batch-size 32 --max-steps 5 \\
        --threads 1 --workers 0 --eval-limit 0 --quiet
    python3 bench/timeline.py /tmp/ddp.rank0.json /tmp/ddp.rank1.json --step 4 --out ddp_step.png

Input: the Chrome-trace JSON files that LOOM_TRACE writes (core/trace.h), one per rank, or
one already merged. Spans are read by name: forward [...] / F<m> stage <s> (forward),
backward [...] / B<m> ... (backward), recompute, all_reduce / all_gather / reduce_scatter / send / recv /
broadcast ... (communication), optimizer step, wait ... (waiting); "step K" marks the
step's boundaries on each process. Other spans (gradient hooks, pipeline forward and
backward, evaluate) only group the ones inside them.

Files of one run (ranks: distinct pids, overlapping in time) share one time axis; files of
separate runs (e.g. GPipe, 1F1B and checkpointing, one file each) each start at their own
step's beginning and are labelled by file name, so they can be compared row by row.

Output: the table on stdout; with --out step.png also the picture (matplotlib, from
Debian's python3-matplotlib; bench/plotting.py installs it) and step.json / step.csv
beside it. --text draws the step as text in the terminal instead (no matplotlib);
--merge OUT writes every input's events as one Chrome trace for https://ui.perfetto.dev.

Per row, over the step's window (its process's "step K" span):
  busy        the fraction covered by computation (forward, backward, recompute,
              optimizer), waiting spans taken out; communication rows: by their transfers
  bubble      1 - busy, for computation rows: the time the row's device stood idle
  hidden      communication rows: the fraction of their time during which their process
              was computing, i.e. the communication that overlapped work
For pipelines also each stage's bubble in the pipeline's part of the step (from the run's
first action to its last; stage_bubbles_of_run), against (S - 1) / (M + S - 1) for S stages
and M micro-batches (docs/pipeline.md); bench/pipeline_bubble.py tabulates it per schedule.
"""
import argparse
import csv
import json
import os
import re
import sys

WIDTH = 100  # --text columns

# kind -> colour; the order is the legend's.
KINDS = {
    "forward": "#4C8BF5",
    "backward": "#F5A623",
    "recompute": "#B8860B",
    "optimizer": "#2CA02C",
    "all-reduce": "#D62728",
    "all-gather": "#9467BD",
    "reduce-scatter": "#8C564B",
    "broadcast": "#E377C2",
    "send": "#17BECF",
    "recv": "#1F9E89",
    "waiting": "#BBBBBB",
}
COMPUTE = {"forward", "backward", "recompute", "optimizer"}
COMM = {"all-reduce", "all-gather", "reduce-scatter", "broadcast", "send", "recv"}
# A pipeline action's span: "F3 stage 1", "B0 stage 0 virtual stage 2" (micro-batch, stage,
# virtual stage; the traces in docs/img, recorded under the older name, say "chunk 2").
ACTION = re.compile(r"([FB])(\d+) stage (\d+)(?: (?:virtual stage|chunk) (\d+))?")


def kind(name):
    """What a span is, from its name; 'step' for the step markers, 'group' for spans that only group others."""
    n = name.lower()
    if re.match(r"step \d+$", n):
        return "step"
    if n.startswith("forward") or re.match(r"f\d+ stage", n):  # "forward", FSDP's "forward <unit>"
        return "forward"
    if n.startswith("backward") or re.match(r"b\d+ stage", n):
        return "backward"
    if n.startswith("recompute"):
        return "recompute"
    if n.startswith("optimizer"):
        return "optimizer"
    if n.startswith("wait"):
        return "waiting"
    for prefix, k in [("all_reduce", "all-reduce"), ("all-reduce", "all-reduce"), ("all_gather", "all-gather"),
                      ("all-gather", "all-gather"), ("reduce_scatter", "reduce-scatter"),
                      ("reduce-scatter", "reduce-scatter"), ("broadcast", "broadcast"), ("send", "send"),
                      ("recv", "recv")]:
        if n.startswith(prefix):
            return k
    return "group"


# ---- reading and merging -------------------------------------------------------------------

def load(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def merge(paths):
    """Every file's events in one list. A process id already taken by an earlier file (two
    separate single-rank runs are both pid 0) is renumbered, and named after its file."""
    merged, taken = [], set()
    for path in paths:
        events = load(path)
        pids = sorted({e["pid"] for e in events if "pid" in e})
        remap = {}
        for pid in pids:
            new = pid
            while new in taken:
                new += 1000
            remap[pid] = new
            taken.add(new)
        stem = os.path.splitext(os.path.basename(path))[0]
        for e in events:
            e = dict(e)
            if "pid" in e:
                e["pid"] = remap[e["pid"]]
            e["file"] = stem
            merged.append(e)
    return merged


def track_names(events):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}


# ---- one step ------------------------------------------------------------------------------

def step_windows(events, step):
    """{pid: (t0, t1)} of each process's "step K" span."""
    windows = {}
    for e in events:
        if e.get("ph") == "X" and e["name"] == f"step {step}":
            windows[e["pid"]] = (e["ts"], e["ts"] + e["dur"])
    if not windows:
        steps = sorted({int(e["name"][5:]) for e in events if e.get("ph") == "X" and kind(e["name"]) == "step"})
        sys.exit(f"timeline.py: no span 'step {step}' in the trace (the trainer records one per optimizer step); "
                 f"steps found: {steps[:3]}...{steps[-3:]}" if steps else
                 f"timeline.py: no span 'step {step}': no 'step N' spans at all; was the trace written by "
                 f"train_cifar10 (LOOM_TRACE=path)?")
    return windows


def runs(windows):
    """Groups the processes whose step windows overlap in time (the ranks of one run); each
    group's time axis starts at its earliest step start. Returns {pid: offset}, [groups]."""
    groups = []
    for pid, (t0, t1) in sorted(windows.items(), key=lambda kv: kv[1][0]):
        if groups and t0 < groups[-1]["end"]:
            groups[-1]["pids"].append(pid)
            groups[-1]["end"] = max(groups[-1]["end"], t1)
        else:
            groups.append({"pids": [pid], "start": t0, "end": t1})
    offsets = {pid: g["start"] for g in groups for pid in g["pids"]}
    for g in groups:
        g["length"] = g["end"] - g["start"]
    return offsets, groups


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(intervals):
    return sum(b - a for a, b in intervals)


def subtract(intervals, holes):
    """intervals minus holes (both unions)."""
    out = []
    for a, b in intervals:
        pieces = [[a, b]]
        for h0, h1 in holes:
            nxt = []
            for p0, p1 in pieces:
                if h1 <= p0 or h0 >= p1:
                    nxt.append([p0, p1])
                    continue
                if p0 < h0:
                    nxt.append([p0, h0])
                if h1 < p1:
                    nxt.append([h1, p1])
            pieces = nxt
        out += pieces
    return out


def intersect(x, y):
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append([a, b])
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(spans, t0, t1):
    return [[max(a, t0), min(b, t1)] for a, b in spans if b > t0 and a < t1]


def busy_intervals(spans, t0, t1, kinds):
    """The union of `kinds` spans within [t0, t1], waiting spans taken out."""
    work = union(clip([(e["ts"], e["ts"] + e["dur"]) for e in spans if kind(e["name"]) in kinds], t0, t1))
    waits = union(clip([(e["ts"], e["ts"] + e["dur"]) for e in spans if kind(e["name"]) == "waiting"], t0, t1))
    return subtract(work, waits)


def analyse(events, step):
    """The step's rows and their fractions: a list of dicts, one per row, in drawing order."""
    windows = step_windows(events, step)
    offsets, groups = runs(windows)
    names = track_names(events)
    files = {e["pid"]: e.get("file", "") for e in events if "pid" in e}
    spans = [e for e in events if e.get("ph") == "X" and e["pid"] in windows and kind(e["name"]) != "step"]
    by_track = {}
    for e in spans:
        t0, t1 = windows[e["pid"]]
        if e["ts"] < t1 and e["ts"] + e["dur"] > t0:
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    several_runs, several_pids = len(groups) > 1, len(windows) > 1
    rows = []
    for (pid, tid), row in sorted(by_track.items()):
        t0, t1 = windows[pid]
        track = names.get((pid, tid), f"track {tid}")
        label = track
        if several_runs:
            label = f"{files[pid]}: {track}" if len(next(g for g in groups if pid in g["pids"])["pids"]) == 1 \
                else f"{files[pid]} rank {pid % 1000}: {track}"
        elif several_pids:
            # A comm track is named by its communicator's rank in its group (a pp x dp stage's
            # replicas are ranks 0 and 1 of theirs); the row says the process's rank.
            label = f"rank {pid}: {track}" if not track.startswith("comm") else re.sub(r"\(rank \d+", f"(rank {pid}", track)
        if "dtensor" in track:
            # A DTensor collective runs on the training thread itself (it blocks it): its row
            # is that thread's communication, drawn apart so that it can be seen.
            label = f"rank {pid}: train thread's collectives"
        stages = {m.group(3) for e in row for m in [ACTION.match(e["name"])] if m}
        if len(stages) == 1 and "stage" not in track:  # the trainer's thread runs stage 0
            label += f" (stage {stages.pop()})"
        kinds = {kind(e["name"]) for e in row} - {"group", "waiting"}
        comm_row = bool(kinds) and kinds <= COMM
        # A DTensor move's collective runs on the training thread, which waits in it: it
        # blocks the computation it sits inside instead of hiding under it.
        rows.append({"pid": pid, "tid": tid, "label": label, "comm": comm_row, "blocking": "dtensor" in track,
                     "spans": row,
                     "window": (t0, t1), "offset": offsets[pid],
                     "run_length": next(g for g in groups if pid in g["pids"])["length"]})
    blocked = {}
    for r in rows:
        if r["comm"] and r["blocking"]:
            blocked[r["pid"]] = union(blocked.get(r["pid"], []) + busy_intervals(r["spans"], *r["window"], COMM))
    for r in rows:
        t0, t1 = r["window"]
        width = max(t1 - t0, 1)
        if r["comm"] and r["blocking"]:
            comm = busy_intervals(r["spans"], t0, t1, COMM)
            r["busy"] = length(comm) / width
            r["bubble"] = None
            r["hidden"] = 0.0 if comm else None
            r["comm_ms"] = length(comm) / 1e3
        elif r["comm"]:
            comm = busy_intervals(r["spans"], t0, t1, COMM)
            compute = union([iv for other in rows if other["pid"] == r["pid"] and not other["comm"]
                             for iv in busy_intervals(other["spans"], t0, t1, COMPUTE)])
            r["busy"] = length(comm) / width
            r["bubble"] = None
            r["hidden"] = length(intersect(comm, compute)) / length(comm) if comm else None
            r["comm_ms"] = length(comm) / 1e3
        else:
            work = busy_intervals(r["spans"], t0, t1, COMPUTE)
            r["busy"] = (length(work) - length(intersect(work, blocked.get(r["pid"], [])))) / width
            r["bubble"] = 1 - r["busy"]
            r["hidden"] = None
    for run in {r["offset"] for r in rows}:
        stage_bubbles_of_run([r for r in rows if r["offset"] == run])
    return rows, windows, offsets


def stage_bubbles_of_run(rows):
    """Sets "stage" and "pipeline_bubble" on each of one run's rows that runs pipeline actions.

    The window is the pipeline's part of the step: from the run's first action ("F3 stage 1",
    "B0 stage 0 virtual stage 2") to its last, over every stage, whether the stages are threads of
    one process or processes (their spans share the machine's one trace clock). A stage's
    bubble is the share of that window its row is not computing; its waits for a message
    inside an action (a stage process's "wait for activation" / "wait for gradient") count
    as idle. The formula's (S-1)/(V·M+S-1) assumes equal stages and free messages; this
    measures what the step did, unequal stages, copies and messages included."""
    actions = [(r, e, m) for r in rows for e in r["spans"] for m in [ACTION.match(e["name"])] if m]
    if not actions:
        return
    p0 = min(e["ts"] for _, e, _ in actions)
    p1 = max(e["ts"] + e["dur"] for _, e, _ in actions)
    for r in {id(r): r for r, _, _ in actions}.values():
        stages = {int(m.group(3)) for q, _, m in actions if q is r}
        if len(stages) == 1:
            r["stage"] = stages.pop()
        r["pipeline_bubble"] = 1 - length(busy_intervals(r["spans"], p0, p1, COMPUTE)) / max(p1 - p0, 1)


def stage_bubbles(events, steps):
    """{stage: mean bubble over `steps`} of a trace of one pipelined run (bench/pipeline_bubble.py)."""
    per_stage = {}
    for step in steps:
        rows, _, _ = analyse(events, step)
        for r in rows:
            if "stage" in r:
                per_stage.setdefault(r["stage"], []).append(r["pipeline_bubble"])
    return {s: sum(v) / len(v) for s, v in sorted(per_stage.items())}


def pipeline_formula(rows):
    """{run: (S, M, bubble)} for each run that has a pipeline (a run: the rows sharing one
    time axis, their "offset"; its stages may be threads of one process or processes), from
    its action names, where the bubble is (S-1)/(M+S-1), or (S-1)/(V*M+S-1) under
    interleaved 1F1B with V virtual stages per stage."""
    found = {}
    for r in rows:
        for e in r["spans"]:
            m = ACTION.match(e["name"])
            if m:
                micro_batches, stages, chunks = found.setdefault(r["offset"], (set(), set(), set()))
                micro_batches.add(m.group(2))
                stages.add(m.group(3))
                if m.group(4) is not None:
                    chunks.add(m.group(4))
    result = {}
    for run, (micro_batches, stages, chunks) in found.items():
        S, M = len(stages), len(micro_batches)
        V = max(1, len(chunks) // S)
        result[run] = (S, M, (S - 1) / (V * M + S - 1))
    return result


def who(rows, windows, pid):
    """The name of process `pid` in the table: its row labels' prefix when there are several."""
    if len(windows) == 1:
        return "the step"
    label = next(r["label"] for r in rows if r["pid"] == pid)
    return label.split(":")[0] if ":" in label else f"rank {pid}"


def run_name(rows, run):
    """A run's name in the table: its first row's label up to the first ':' (its file's name)."""
    label = next(r["label"] for r in rows if r["offset"] == run)
    return label.split(":")[0].split(" rank ")[0]


def table(rows, windows, step):
    fmt = lambda x: "" if x is None else f"{100 * x:.0f}%"
    steps = ", ".join(f"{who(rows, windows, pid)} {(t1 - t0) / 1e3:.0f} ms" for pid, (t0, t1) in sorted(windows.items()))
    lines = [f"step {step}: {steps}", f"  {'row':34s} {'busy':>5s} {'bubble':>6s} {'hidden':>6s}  {'in pipeline':>11s}"]
    for r in rows:
        pb = r.get("pipeline_bubble")
        lines.append(f"  {r['label'][:34]:34s} {fmt(r['busy']):>5s} {fmt(r['bubble']):>6s} {fmt(r['hidden']):>6s}  "
                     f"{'' if pb is None else 'bubble ' + fmt(pb):>11s}")
    several_runs = len({r["offset"] for r in rows}) > 1
    for run, (s, m, f) in sorted(pipeline_formula(rows).items()):
        measured = [r["pipeline_bubble"] for r in rows if r["offset"] == run and "pipeline_bubble" in r]
        name = run_name(rows, run) if several_runs else "pipeline"
        lines.append(f"  {name}: S = {s} stages, M = {m} micro-batches: (S-1)/(V·M+S-1) = {100 * f:.0f}%; "
                     f"measured bubble per stage {', '.join(fmt(b) for b in measured)} "
                     f"(mean {fmt(sum(measured) / len(measured))})")
    comm = [r for r in rows if r["comm"] and r["hidden"] is not None]
    if comm:
        total = sum(r["comm_ms"] for r in comm)
        hidden = sum(r["comm_ms"] * r["hidden"] for r in comm)
        lines.append(f"  communication: {total:.1f} ms in all, {100 * hidden / max(total, 1e-9):.0f}% of it hidden "
                     f"under computation")
    return "\n".join(lines)


def records(rows, step):
    out = []
    for r in rows:
        t0, t1 = r["window"]
        out.append({"step": step, "row": r["label"], "pid": r["pid"], "tid": r["tid"],
                    "kind": "communication" if r["comm"] else "compute", "step_ms": round((t1 - t0) / 1e3, 3),
                    "busy": round(r["busy"], 4), "bubble": None if r["bubble"] is None else round(r["bubble"], 4),
                    "hidden": None if r["hidden"] is None else round(r["hidden"], 4),
                    "pipeline_bubble": round(r["pipeline_bubble"], 4) if "pipeline_bubble" in r else None})
    return out


# ---- drawing -------------------------------------------------------------------------------

def short(name):
    """The label a span gets inside its bar."""
    m = ACTION.match(name)
    if m:
        return m.group(1) + m.group(2)
    m = re.match(r"all_reduce bucket (\d+)", name)
    if m:
        return "b" + m.group(1)
    return {"forward": "fwd", "backward": "bwd", "optimizer step": "opt", "recompute": "re"}.get(name, "")


def draw_png(rows, windows, offsets, step, out, title, relative=False):
    """relative: each run's step spans 0-100% (runs of different speed compared by shape)."""
    from plotting import pyplot
    plt = pyplot()
    n = len(rows)
    height = 1.25 + 0.42 * n  # inches: the rows, plus fixed margins for the title, axis and legend
    fig, ax = plt.subplots(figsize=(11, height))
    fig.subplots_adjust(left=1.9 / 11, right=1 - 1.0 / 11, top=1 - 0.35 / height, bottom=0.8 / height)
    length = {r["pid"]: r["run_length"] for r in rows}

    def x(pid, t):  # the axis position of time t (us) on process pid's row
        return (t - offsets[pid]) / (length[pid] / 100 if relative else 1e3)

    span_ms = max(x(pid, t1) for pid, (t0, t1) in windows.items())
    for i, r in enumerate(rows):
        y = n - 1 - i
        # Outer spans first, so nested ones (recompute in a backward, waiting) are drawn over them.
        for e in sorted(r["spans"], key=lambda e: -e["dur"]):
            k = kind(e["name"])
            # A span inside a longer one of its kind (DataParallel's replica-0 forward in the
            # trainer's) is drawn, but labelled once.
            inner = any(o is not e and kind(o["name"]) == k and o["dur"] > e["dur"] and o["ts"] <= e["ts"] and
                        e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in r["spans"])
            a, b = x(r["pid"], e["ts"]), x(r["pid"], e["ts"] + e["dur"])
            if k == "group":
                ax.broken_barh([(a, b - a)], (y - 0.42, 0.07), color="#999999")
                continue
            ax.broken_barh([(a, b - a)], (y - 0.3, 0.6), facecolor=KINDS[k], edgecolor="white", linewidth=0.4,
                           hatch="//" if k == "waiting" else None)
            if (b - a) / span_ms > 0.025 and short(e["name"]) and not inner:
                ax.text((a + b) / 2, y, short(e["name"]), ha="center", va="center", fontsize=7, color="black")
        stat = f"busy {100 * r['busy']:.0f}%"
        if r["hidden"] is not None:
            stat += f"\nhidden {100 * r['hidden']:.0f}%"
        elif "pipeline_bubble" in r:
            stat += f"\npipeline bubble {100 * r['pipeline_bubble']:.0f}%"
        ax.text(1.005, (y + 0.5) / n, stat, transform=ax.transAxes, fontsize=7, va="center")
    for pid, (t0, t1) in windows.items():
        for t in (t0, t1):
            ax.axvline(x(pid, t), color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(n))
    ax.set_yticklabels([r["label"] for r in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel(f"% of each run's step {step}" if relative else
                  f"ms from the start of step {step} (dashed: the step's boundaries)")
    present = {kind(e["name"]) for r in rows for e in r["spans"]} - {"group"}
    from matplotlib.patches import Patch
    handles = [Patch(facecolor=c, label=k, hatch="//" if k == "waiting" else None) for k, c in KINDS.items()
               if k in present]
    if any(kind(e["name"]) == "group" for r in rows for e in r["spans"]):  # the thin grey bars
        handles.append(Patch(facecolor="#999999", label="grouping span (gradient hooks, a pipeline pass)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", color="#EEEEEE")
    ax.set_axisbelow(True)
    # bbox "tight" grows the canvas to whatever text runs past the margins (a long row
    # label, a title, "pipeline bubble NN%") instead of cutting it off.
    fig.savefig(out, dpi=90, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)


def draw_text(rows, windows, offsets, step):
    """The step as text, one line per nesting level of each row (the picture for a terminal)."""
    end = max(t1 - offsets[pid] for pid, (t0, t1) in windows.items())
    scale = WIDTH / max(end, 1)
    lines = [f"step {step}: {end / 1e3:.0f} ms ({end / 1e3 / WIDTH:.1f} ms per column)"]
    for r in rows:
        levels = []
        for e in sorted(r["spans"], key=lambda e: (e["ts"], -e["dur"])):
            for level in levels:
                if level[-1]["ts"] + level[-1]["dur"] <= e["ts"]:
                    level.append(e)
                    break
            else:
                levels.append([e])
        for i, level in enumerate(levels):
            canvas = [" "] * WIDTH
            for e in level:
                a = int((e["ts"] - r["offset"]) * scale)
                b = max(a + 1, int((e["ts"] + e["dur"] - r["offset"]) * scale))
                label = e["name"].replace("all_reduce bucket ", "b")
                text = ("[" + label + "]" + "-" * WIDTH)[: b - a] if b - a >= 3 else "|" * (b - a)
                for j, c in enumerate(text):
                    if 0 <= a + j < WIDTH:
                        canvas[a + j] = c
            lines.append(f"  {(r['label'] if i == 0 else '')[:22]:22s} {''.join(canvas).rstrip()}")
    for r in rows:  # each transfer, with what the tracer recorded about it
        for e in sorted((e for e in r["spans"] if kind(e["name"]) in COMM and e.get("args")), key=lambda e: e["ts"]):
            a = e["args"]
            lines.append(f"    {r['label']}: {e['name']}: launched at +{(e['ts'] - r['window'][0]) / 1e3:.0f} ms, took "
                         f"{e['dur'] / 1e3:.0f} ms, {a.get('params', '?')} parameters, "
                         f"{a.get('bytes', 0) / 2**20:.1f} MiB")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", help="LOOM_TRACE files: one per rank, or one per run to compare")
    parser.add_argument("--step", type=int, default=3, help="which optimizer step to draw (1-based; default 3)")
    parser.add_argument("--out", help="write the picture here (.png or .svg) and its numbers as .json and .csv beside it")
    parser.add_argument("--title", help="the picture's title (default: the files' names and the step)")
    parser.add_argument("--relative", action="store_true",
                        help="x axis in %% of each run's step: compare runs of different speed by their shape")
    parser.add_argument("--text", action="store_true", help="draw the step as text on stdout (no matplotlib)")
    parser.add_argument("--merge", help="write every input's events into this one Chrome trace file")
    args = parser.parse_args(argv)
    if args.out:
        from plotting import pyplot
        pyplot()  # before the work: it may start this script again under Debian's python3
    events = merge(args.traces)
    rows, windows, offsets = analyse(events, args.step)
    if args.text:
        print(draw_text(rows, windows, offsets, args.step))
    print(table(rows, windows, args.step))
    if args.merge:
        with open(args.merge, "w") as f:
            json.dump({"displayTimeUnit": "ms", "traceEvents": [{k: v for k, v in e.items() if k != "file"}
                                                                for e in events]}, f)
        print(f"merged {len(args.traces)} files into {args.merge}")
    if args.out:
        base = os.path.splitext(args.out)[0]
        recs = records(rows, args.step)
        formula = {run_name(rows, run): {"stages": s, "micro_batches": m, "formula_bubble": round(f, 4)}
                   for run, (s, m, f) in pipeline_formula(rows).items()}
        with open(base + ".json", "w") as f:
            json.dump({"traces": args.traces, "step": args.step, "rows": recs, "pipelines": formula}, f, indent=1)
        with open(base + ".csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(recs[0].keys()))
            w.writeheader()
            w.writerows(recs)
        title = args.title or f"{', '.join(os.path.basename(t) for t in args.traces)}: step {args.step}"
        draw_png(rows, windows, offsets, args.step, args.out, title, args.relative)
        print(f"wrote {args.out}, {base}.json, {base}.csv")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
