"""What every results file in bench/results/ carries besides its rows, and how it is written:
the machine, the commit and the date (bench/report.py renders the file into docs/)."""
import datetime
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine():
    """{"cpu": /proc/cpuinfo's model name, "cores": the CPUs the OS reports, "isa": the widest vector
    instructions it lists (avx512_bf16, avx512f, avx2 or sse), "family"/"model": its numbers}: one model
    name covers CPUs as different as an AVX2-only and an AVX-512 EPYC, and kernel speeds differ with them."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    isa = next((name for name in ("avx512_bf16", "avx512f", "avx2") if name in flags), "sse")
    doc = {"cpu": fields.get("model name", "unknown CPU"), "cores": os.cpu_count(), "isa": isa}
    if "cpu family" in fields and "model" in fields:
        doc["family"], doc["model"] = int(fields["cpu family"]), int(fields["model"])
    return doc


def commit():
    """The short hash of HEAD, with -dirty when tracked files differ from it."""
    def git(*a):
        return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def commit_hash(commit):
    """The hash a caption or a picture names for a recorded commit. A caption states the
    conditions of a measurement, not how it was made: git's "-dirty" (commit()'s mark of a
    working tree that differed from its commit) stays in the file for whoever audits it, and
    a run whose changes touched the measured code says so in its conditions."""
    return commit[:-len("-dirty")] if commit.endswith("-dirty") else commit


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def document(title, script, columns, rows, ratios, started, conditions="", labels=None):
    """A results file: the command is this process's own (script + its arguments). labels: the
    columns that name a row, where the first alone does not (bench/docs_figures.py)."""
    doc = {"title": title, "command": f"python3 bench/{script} " + shlex.join(sys.argv[1:]), "machine": machine(),
           "commit": commit(), "date": started, "columns": columns, "rows": rows, "ratios": ratios}
    if conditions:
        doc["conditions"] = conditions
    if labels:
        doc["labels"] = labels
    return doc


def write(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {path}; python3 bench/report.py renders it into docs/")
