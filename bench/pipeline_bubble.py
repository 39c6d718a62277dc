"""The pipeline's bubble, measured: per stage, the share of each training step it spends
idle, from LOOM_TRACE spans, against the schedule's (S - 1) / (V·M + S - 1).

    python3 bench/pipeline_bubble.py                      # ResNet18, 2 stages, 4 micro-batches
    python3 bench/pipeline_bubble.py --model tiny --steps 3 --batch-size 16   # a quick check

For each schedule (GPipe, 1F1B, interleaved 1F1B with V = 2) it trains a few steps with
the stages on threads of one process (--mode pipeline --mp-devices S) and as processes
(--pp S under loomrun), with LOOM_TRACE on. This file only runs them: the measurement is
bench/timeline.py's (stage_bubbles_of_run, the "in pipeline" column of its table), here
averaged over the steps after the first (warm-up).
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timeline  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
                events = timeline.merge(sorted(glob.glob(os.path.join(tmp, "trace*.json"))))
                measured = timeline.stage_bubbles(events, range(2, args.steps + 1))
                print(f"{schedule:18s} {V:2d} {where:10s} {expected:15.3f}  " +
                      "  ".join(f"{measured[s]:8.3f}" for s in range(S)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
