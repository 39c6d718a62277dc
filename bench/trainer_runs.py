"""A run of examples/train_cifar10 for the bench scripts that read what a mode holds and
moves, not how fast it goes: its --metrics-json (rank 0's figures and bytes per step), the
line rank 0 prints with every rank's memory, and the pipeline's cut it reports. Bytes and
model state do not depend on the machine or its load; the peak depends on the allocator only.
"""
import json
import os
import re
import subprocess
import tempfile

MEMORY = re.compile(r"rank (\d+) peak ([\d.]+), model state ([\d.]+)")
BALANCE = re.compile(r"pipeline balance: (\S+)")


def per_rank(values):
    """One figure where every rank has the same, else each rank's, rank 0 first."""
    return values[0] if len(set(values)) == 1 else values


def attempt(build, ranks, flags, env=None):
    """train_cifar10 --synthetic with `flags` on `ranks` processes (loomrun when more than one):
    {"ok": whether it exited 0, "out_of_memory": whether it stopped with an OutOfMemoryError,
     "command", "output": its stdout and stderr, and where it succeeded "metrics": its
     --metrics-json, "peak_mib": [...], "state_mib": [...] (per rank), "balance": the pipeline's
     cut or None}."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.json")
        cmd = [os.path.join(build, "examples", "train_cifar10"), "--synthetic", "--threads", "1", "--workers", "0",
               "--eval-limit", "0", *flags, "--metrics-json", metrics]
        if ranks > 1:
            cmd = [os.path.join(build, "parallel", "loomrun"), "--standalone", "--nproc_per_node", str(ranks), *cmd]
        # Not --quiet: the progress output is where a pipeline reports its cut.
        done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})), capture_output=True,
                              text=True)
        result = {"ok": done.returncode == 0, "command": " ".join(cmd), "output": done.stdout + done.stderr,
                  "out_of_memory": done.returncode != 0 and "out of memory" in done.stdout + done.stderr}
        if not result["ok"]:
            return result
        with open(metrics) as f:
            result["metrics"] = json.load(f)
    if result["metrics"].get("estimate"):  # --estimate-memory: its figures are in the metrics
        return result
    ranks_seen = sorted((int(r), float(p), float(s)) for r, p, s in MEMORY.findall(done.stdout))
    if len(ranks_seen) != ranks:
        raise SystemExit(f"{result['command']}: expected a 'memory per rank' line with {ranks} ranks, got:\n{done.stdout}")
    result["peak_mib"] = [p for _, p, _ in ranks_seen]
    result["state_mib"] = [s for _, _, s in ranks_seen]
    balance = BALANCE.search(done.stderr + done.stdout)
    result["balance"] = balance.group(1) if balance else None
    return result


def train(build, ranks, flags):
    """attempt(), which must succeed: {"metrics", "peak_mib", "state_mib", "balance"}."""
    result = attempt(build, ranks, flags)
    if not result["ok"]:
        raise SystemExit(f"{result['command']}\nfailed:\n{result['output'][-3000:]}")
    return result
