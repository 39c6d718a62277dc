"""Reads the LOOM_TRACE files of a DDP run: merges the ranks into one Chrome trace and
draws a step of each rank as text, the picture docs/ddp.md shows.

    LOOM_TRACE=/tmp/ddp.json build/parallel/loomrun --nproc_per_node 2 \\
        build/examples/train_cifar10 --mode ddp --synthetic --max-steps 5 --threads 1 --workers 0
    python3 bench/bench_ddp_trace.py /tmp/ddp.rank0.json /tmp/ddp.rank1.json --step 4 --merge /tmp/ddp.json

--merge writes one file with every rank (open it in https://ui.perfetto.dev); each rank is
a process row there, since loom writes the rank as the trace's pid.
"""
import argparse
import json
import sys

WIDTH = 100


def load(path):
    with open(path) as f:
        return json.load(f)["traceEvents"]


def track_names(events):
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}


def draw_step(events, step):
    spans = [e for e in events if e.get("ph") == "X"]
    marker = [e for e in spans if e["name"] == f"step {step}"]
    if not marker:
        sys.exit(f"bench_ddp_trace.py: no span 'step {step}' (the trainer records one per optimizer step)")
    t0, t1 = marker[0]["ts"], marker[0]["ts"] + marker[0]["dur"]
    names = track_names(events)
    scale = WIDTH / max(t1 - t0, 1)
    rows = {}
    for e in spans:
        if e["ts"] < t0 or e["ts"] > t1 or e is marker[0]:
            continue
        rows.setdefault((e["pid"], e["tid"]), []).append(e)
    lines = [f"rank {marker[0]['pid']}, step {step}: {(t1 - t0) / 1e3:.0f} ms ({(t1 - t0) / 1e3 / WIDTH:.0f} ms per column)"]
    for key, row in sorted(rows.items()):
        # Nested spans (gradient hooks inside backward) get their own line.
        levels = []
        for e in sorted(row, key=lambda e: (e["ts"], -e["dur"])):
            for level in levels:
                if level[-1]["ts"] + level[-1]["dur"] <= e["ts"]:
                    level.append(e)
                    break
            else:
                levels.append([e])
        for i, level in enumerate(levels):
            canvas = [" "] * WIDTH
            for e in level:
                a = int((e["ts"] - t0) * scale)
                b = max(a + 1, int((e["ts"] + e["dur"] - t0) * scale))
                label = e["name"].replace("all_reduce bucket ", "b")
                text = ("[" + label + "]" + "-" * WIDTH)[: b - a] if b - a >= 3 else "|" * (b - a)
                for j, c in enumerate(text):
                    if a + j < WIDTH:
                        canvas[a + j] = c
            name = names.get(key, f"track {key[1]}") if i == 0 else ""
            lines.append(f"  {name[:14]:14s} {''.join(canvas).rstrip()}")
    for e in sorted((e for e in spans if e["name"].startswith("all_reduce bucket") and t0 <= e["ts"] <= t1),
                    key=lambda e: e["ts"]):
        args = e.get("args", {})
        lines.append(f"    {e['name']}: launched at +{(e['ts'] - t0) / 1e3:.0f} ms, took {e['dur'] / 1e3:.0f} ms, "
                     f"{args.get('params', '?')} parameters, {args.get('bytes', 0) / 2**20:.1f} MiB")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="+", help="LOOM_TRACE files, one per rank")
    parser.add_argument("--step", type=int, default=3, help="which optimizer step to draw (1-based)")
    parser.add_argument("--merge", help="write every rank's events into this one file")
    args = parser.parse_args()
    merged = []
    for path in args.traces:
        events = load(path)
        merged += events
        print(draw_step(events, args.step))
    if args.merge:
        with open(args.merge, "w") as f:
            json.dump({"displayTimeUnit": "ms", "traceEvents": merged}, f)
        print(f"merged {len(args.traces)} ranks into {args.merge}")


if __name__ == "__main__":
    main()
