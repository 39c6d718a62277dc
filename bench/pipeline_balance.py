"""Where the pipeline cuts ResNet18: the cost model (counted FLOPs and bytes, the same every
run) against the measured layer times, for 2, 3 and 4 stages at micro-batches of 8 and 32.

    python3 bench/pipeline_balance.py --out bench/results/pipeline_balance.json

Each cell is the balance train_cifar10 prints ("pipeline balance: 9,5 (by cost)") for
--mode pipeline --mp-devices S --microbatches 4 --balance cost|time, one training step on
one thread. The measured balance moves with the machine's load (the results file records
the load average); the cost model's does not.
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402

MICROBATCHES = 4


def balance(args, micro_batch, stages, by):
    cmd = [os.path.join(args.build, "examples", "train_cifar10"), "--mode", "pipeline", "--mp-devices", str(stages),
           "--microbatches", str(MICROBATCHES), "--batch-size", str(micro_batch * MICROBATCHES), "--balance", by,
           "--synthetic", "--max-steps", "1", "--threads", "1", "--workers", "0", "--eval-limit", "0"]
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    found = re.search(r"pipeline balance: (\S+) \(by " + by + r"\)", done.stderr + done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(cmd)}\nexit status {done.returncode}, no 'pipeline balance' line:\n"
                         f"{done.stderr[-3000:]}")
    return found.group(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batches", default="8,32", help="micro-batch sizes")
    parser.add_argument("--stages", default="2,3,4")
    parser.add_argument("--build", default=os.path.join(results_file.ROOT, "build"))
    parser.add_argument("--out", help="write the results file (bench/report.py renders it into docs/)")
    args = parser.parse_args()
    started, load_before = results_file.now(), os.getloadavg()[0]
    rows = []
    for micro_batch in map(int, args.micro_batches.split(",")):
        for stages in map(int, args.stages.split(",")):
            rows.append({"micro_batch": micro_batch, "stages": stages, "cost": balance(args, micro_batch, stages, "cost"),
                         "time": balance(args, micro_batch, stages, "time")})
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    conditions = f"Load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after."
    if args.out:
        columns = [{"key": "micro_batch", "title": "micro-batch"}, {"key": "stages", "title": "stages"},
                   {"key": "cost", "title": "by cost"}, {"key": "time", "title": "by time"}]
        title = ("Where the pipeline cuts ResNet18: layers per stage by the cost model (--balance cost) and by "
                 "measured layer times (--balance time), on one thread")
        results_file.write(args.out, results_file.document(title, "pipeline_balance.py", columns, rows, [], started,
                                                           conditions))


if __name__ == "__main__":
    main()
