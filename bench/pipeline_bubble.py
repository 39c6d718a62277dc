"""The pipeline's bubble, measured: per stage, the share of each training step it spends
idle, from LOOM_TRACE spans, against the schedule's (S - 1) / (V·M + S - 1).

    python3 bench/pipeline_bubble.py                      # ResNet18, 2 stages, 4 micro-batches
    python3 bench/pipeline_bubble.py --model tiny --steps 3 --batch-size 16   # a quick check

For each schedule (GPipe, 1F1B, interleaved 1F1B with V = 2) it trains a few steps with
the stages on threads of one process (--mode pipeline --mp-devices S) and as processes
(--pp S under loomrun), with LOOM_TRACE on, and reads the spans each stage records: one
per action ("F3 stage 1", "B0 stage 0 chunk 2", category "pipeline"), and, in a stage
process, the waits for a message inside an action (category "pipeline wait"). A step's
window runs from its first action's start to its last action's end over every stage; a
stage's busy time is its actions' time less its waits; its bubble is 1 - busy / window.
The first step (warm-up) is left out; the table gives the mean over the others. The
formula assumes stages of equal time and free communication; the measurement includes
what the formula leaves out: unequal stages (the balance), copies and messages.
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACTION = re.compile(r"^[FB](\d+) stage (\d+)")


def load_events(paths):
    events = []
    for rank, path in enumerate(sorted(paths)):
        with open(path) as f:
            doc = json.load(f)
        for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
            if e.get("ph") == "X":
                events.append(dict(e, file=rank))
    return events


def bubbles(events, stages):
    """Mean bubble per stage over the steps after the first, and the steps counted."""
    steps = collections.defaultdict(list)  # step number -> the "step N" spans of every process
    for e in events:
        m = re.match(r"^step (\d+)$", e["name"])
        if m and e.get("cat") == "train":
            steps[int(m.group(1))].append(e)
    per_stage = collections.defaultdict(list)
    for n, spans in sorted(steps.items()):
        if n == 1:
            continue  # warm-up
        lo = min(s["ts"] for s in spans)
        hi = max(s["ts"] + s["dur"] for s in spans)
        actions = [e for e in events if e.get("cat") == "pipeline" and lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
        waits = [e for e in events if e.get("cat") == "pipeline wait" and lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
        if not actions:
            continue
        start = min(a["ts"] for a in actions)
        end = max(a["ts"] + a["dur"] for a in actions)
        busy = collections.Counter()
        for a in actions:
            busy[int(ACTION.match(a["name"]).group(2))] += a["dur"]
        for w in waits:  # a stage process's wait happens on its own (one) thread: its file
            busy[w["file"]] -= w["dur"]
        for s in range(stages):
            per_stage[s].append(1 - busy[s] / (end - start))
    return [sum(v) / len(v) for _, v in sorted(per_stage.items())], len(next(iter(per_stage.values()), []))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=4, help="micro-batches M")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="the first is not counted")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args()
    train = os.path.join(args.build, "examples", "train_cifar10")
    loomrun = os.path.join(args.build, "parallel", "loomrun")
    S, M = args.stages, args.chunks
    common = ["--mode", "pipeline", "--model", args.model, "--synthetic", "--batch-size", str(args.batch_size),
              "--max-steps", str(args.steps), "--epochs", "1", "--workers", "0", "--eval-limit", "0", "--quiet",
              "--chunks", str(M)]
    schedules = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]
    print(f"# {args.model}, {S} stages, M = {M} micro-batches of {args.batch_size // M}, "
          f"{args.steps - 1} steps measured")
    print(f"{'schedule':18s} {'V':>2s} {'where':10s} {'(S-1)/(VM+S-1)':>15s}  " +
          "  ".join(f"{'stage ' + str(s):>8s}" for s in range(S)))
    with tempfile.TemporaryDirectory() as tmp:
        for schedule, V in schedules:
            flags = ["--pipeline-schedule", schedule, "--virtual-stages", str(V)]
            expected = (S - 1) / (V * M + S - 1)
            for where in ("threads", "processes"):
                for old in glob.glob(os.path.join(tmp, "*.json")):
                    os.remove(old)
                trace = os.path.join(tmp, "trace.json")
                if where == "threads":
                    cmd = [train, *common, *flags, "--mp-devices", str(S), "--threads", str(S)]
                else:
                    cmd = [loomrun, "--standalone", "--nproc_per_node", str(S), train, *common, *flags,
                           "--pp", str(S), "--threads", "1"]
                env = dict(os.environ, LOOM_TRACE=trace, OMP_NUM_THREADS="1" if where == "processes" else str(S))
                subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                measured, _ = bubbles(load_events(glob.glob(os.path.join(tmp, "trace*.json"))), S)
                print(f"{schedule:18s} {V:2d} {where:10s} {expected:15.3f}  " +
                      "  ".join(f"{b:8.3f}" for b in measured), flush=True)


if __name__ == "__main__":
    sys.exit(main())
