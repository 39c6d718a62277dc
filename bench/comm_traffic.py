"""The bytes each mode moves per training step, counted by loom's communicators
(parallel/comm/traffic.h) beside the formulas of docs/communication.md.

    python3 bench/comm_traffic.py --table modes --out bench/results/traffic_modes.json
    python3 bench/comm_traffic.py --table trainer --out bench/results/traffic_trainer.json

--table modes runs test_traffic_modes' table case on ResNet18 (one step of each mode, ranks as
threads of one process, 8 x 8 images; the test itself checks every count within 5% of its
formula and exactly against the buckets' and units'), and keeps the table it prints.
--table trainer runs train_cifar10 under loomrun with the flags of each row, and keeps its
--metrics-json "comm_bytes_per_step" (rank 0) and every rank's memory. Bytes do not depend
on the machine or its load.
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402
import trainer_runs  # noqa: E402

PARAMETERS = 11_173_962  # Ψ, ResNet18 (CIFAR stem, 10 classes)
# What FSDP keeps gathered by default (the last block and the head): layer4[1]'s two 3x3
# convolutions and two BatchNorms, and the 512 -> 10 Linear.
KEPT_GATHERED = 2 * 512 * 512 * 9 + 4 * 512 + 512 * 10 + 10
KINDS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv"]
HEADER = re.compile(r"resnet18: Ψ = ([\d,]+) float32 parameters \(4Ψ = ([\d,]+) bytes\), Ψ_freed = ([\d,]+) .*"
                    r"buffers ([\d,]+) bytes")


def number(text):
    return int(text.replace(",", ""))


def modes_table(args):
    test = os.path.join(args.build, "tests", "test_traffic_modes")
    done = subprocess.run([test, "-tc=*table*"], env=dict(os.environ, LOOM_TRAFFIC_MODEL="resnet18"),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{test} -tc='*table*' failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    header = HEADER.search(done.stdout)
    if not header:
        raise SystemExit(f"{test}: no 'resnet18: Ψ = ...' line in its output:\n{done.stdout[-3000:]}")
    psi, _, freed, buffers = map(number, header.groups())
    rows = []
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or not cells[1].isdigit():
            continue  # the heading, the rule, anything else
        mode, n, kind, formula, formula_bytes, measured, _ = cells
        rows.append({"mode": mode, "n": int(n), "collective": kind, "formula": formula,
                     "formula_bytes": number(formula_bytes), "measured_bytes": number(measured),
                     "difference": number(measured) - number(formula_bytes)})
    title = (f"Bytes per rank in one training step, formula against count: ResNet18 (CIFAR), Ψ = {psi:,} float32 "
             f"parameters (4Ψ = {4 * psi:,} bytes), Ψ_freed = {freed:,} (every FSDP unit but the last, the head, "
             f"freed after forward), BatchNorm buffers {buffers:,} bytes; 4 images of 8 x 8 per rank, one SGD step, "
             "ranks as threads of one process over shared memory")
    columns = [{"key": "mode", "title": "mode"}, {"key": "n", "title": "N"},
               {"key": "collective", "title": "collective"}, {"key": "formula", "title": "formula"},
               {"key": "formula_bytes", "title": "formula (bytes)", "format": ","},
               {"key": "measured_bytes", "title": "measured (bytes)", "format": ","},
               {"key": "difference", "title": "measured − formula", "format": "+,"}]
    return title, columns, rows


# The rows of --table trainer: flags, world size, and what the counts are (a function of the
# row and the rows before it, so that every number in it comes from this file).
def replicate_note(row, rows, args):
    return f"all_reduce = 2(N−1)/N · 4Ψ = 4Ψ = {4 * PARAMETERS:,}"


def shard_note(row, rows, args):
    freed = PARAMETERS - KEPT_GATHERED
    return (f"reduce_scatter = (N−1)/N · 4Ψ = 2Ψ = {2 * PARAMETERS:,}; all_gather = 2(Ψ + Ψ_freed) = "
            f"{2 * (PARAMETERS + freed):,}, the last block and the head kept gathered (Ψ_freed = {freed:,})")


def pp_note(row, rows, args):
    sent = row["recv"]
    return (f"the cut (balance {row['balance']}): {sent:,} bytes of activations each way, "
            f"{sent // (4 * args.batch_size):,} float32 values per image, + {row['send'] - sent} bytes of shape "
            "messages; the all_reduce is the step's status (the loss and failure flags)")


def pp_shard_note(row, rows, args):
    return (f"stage 0's Ψ_stage = reduce_scatter / 2 = {row['reduce_scatter'] // 2:,}: one all_gather and one "
            "reduce_scatter of (N−1)/N · 4Ψ_stage = 2Ψ_stage per step, whatever the micro-batches")


def pp_always_note(row, rows, args):
    before = rows[-1]
    return (f"FULL_SHARD per micro-batch: every forward and backward gathers its units again (the stage's last unit "
            f"stays gathered from its forward to its backward): {row['all_gather'] / before['all_gather']:.1f}× "
            "the gathers of the row above, the same reduce_scatter")


TRAINER_ROWS = [(["--dp-replicate", "2"], 2, replicate_note), (["--dp-shard", "2"], 2, shard_note),
                (["--pp", "2"], 2, pp_note), (["--pp", "2", "--dp-shard", "2"], 4, pp_shard_note),
                (["--pp", "2", "--dp-shard", "2", "--reshard-after-forward", "always"], 4, pp_always_note)]


def trainer_table(args):
    rows = []
    for flags, world, note in TRAINER_ROWS:
        run = trainer_runs.train(args.build, world, ["--max-steps", str(args.steps), "--batch-size",
                                                     str(args.batch_size), *flags])
        row = {"flags": "`" + " ".join(flags) + "`", "world": world, **run["metrics"]["comm_bytes_per_step"],
               "peak_mib": trainer_runs.per_rank(run["peak_mib"]), "state_mib": trainer_runs.per_rank(run["state_mib"]),
               "balance": run["balance"]}
        row["note"] = note(row, rows, args)
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    for row in rows:
        del row["balance"]
    title = (f"train_cifar10 --metrics-json's comm_bytes_per_step (rank 0, bytes per step) and every rank's memory "
             f"(MiB, rank 0 first where they differ): ResNet18 (CIFAR), Ψ = {PARAMETERS:,}, batch {args.batch_size} "
             f"per data-parallel rank, 4 micro-batches under a pipeline, {args.steps} steps")
    columns = [{"key": "flags", "title": "flags"}, {"key": "world", "title": "world"},
               *({"key": k, "title": k, "format": ","} for k in KINDS),
               {"key": "peak_mib", "title": "peak", "format": ".1f"},
               {"key": "state_mib", "title": "model state", "format": ".1f"},
               {"key": "note", "title": "the counts, read"}]
    return title, columns, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", choices=["modes", "trainer"], required=True)
    parser.add_argument("--steps", type=int, default=3, help="--table trainer: training steps per run")
    parser.add_argument("--batch-size", type=int, default=8, help="--table trainer: per data-parallel rank")
    parser.add_argument("--build", default=os.path.join(results_file.ROOT, "build"))
    parser.add_argument("--out", help="write the results file (bench/report.py renders it into docs/)")
    args = parser.parse_args()
    started = results_file.now()
    title, columns, rows = (modes_table if args.table == "modes" else trainer_table)(args)
    for row in rows if args.table == "modes" else []:
        print(" ".join(f"{k}={v}" for k, v in row.items()))
    if args.out:
        results_file.write(args.out, results_file.document(title, "comm_traffic.py", columns, rows, [], started))


if __name__ == "__main__":
    main()
