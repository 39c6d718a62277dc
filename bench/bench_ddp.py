"""DDP throughput on CPU: loom's DDP vs the same processes without communication vs PyTorch.

    python3 bench/bench_ddp.py                         # resnet18, batch 32, 2 x 1 thread
    python3 bench/bench_ddp.py --model tiny --steps 30 --repeat 3

Runs, interleaved (--repeat times), each with --world-size processes of one compute
thread on synthetic CIFAR-shaped data:
  loom ddp (shm)   loomrun --nproc_per_node W train_cifar10 --mode ddp: the gloo backend,
                   whose collectives go through shared memory on one host (the default)
  loom ddp (tcp)   the same with LOOM_GLOO_SHM=0: collectives over Gloo's loopback TCP
  loom ddp (shm, bound)   the same with loomrun --numa-binding exclusive: each rank on its
                   own cores (Note [Why bind DDP workers to cores])
  loom independent W x train_cifar10 --mode single at the same time (same flags, no
                   communication): the ceiling DDP is measured against
  loom independent (bound) the same, each process on the cores a bound rank would get
  torch ddp        bench/ddp_torch.py: torch.nn.parallel.DistributedDataParallel, gloo
and prints img/s (the median over repeats of world * batch / median step time) and the
ratios, both of the medians and the median of each repeat's own ratio (configurations of
one repeat run minutes apart at most, so that one is robust to the host's drift). The
results file keeps the ratio of the medians shown, with the range of the per-repeat ratios.
--out FILE writes the table as a results file (bench/results/ddp.json is the one
docs/benchmarks.md renders: python3 bench/report.py).

DDP's ranks move in lockstep, so a step takes as long as the slowest rank's; independent
processes each go at their own core's pace. Where cores differ in speed (on a
shared 2-core VM one can be a few % slower), part of the gap is the cores', not DDP's. So the
independent rows also give their synchronous ceiling, world * batch / the slowest
process's step time, and DDP is measured against it as well.

On a shared machine the wall-clock numbers move with the neighbours' load, and DDP
(whose ranks wait for each other every step) suffers from it more than independent
processes do. So each run's CPU time (user + sys of every process, from getrusage) is
reported too, per training image: a load-independent view of what DDP itself costs.
Both include start-up, the same for every configuration.
Needs a built loom (build/) and, for the PyTorch row, python3-torch (--torch-python).
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_file  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env):
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"bench_ddp.py: failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}")
    return done.stdout


def loom_args(args, metrics):
    return ["--model", args.model, "--synthetic", "--batch-size", str(args.batch_size), "--max-steps", str(args.steps),
            "--epochs", "1", "--threads", "1", "--workers", "0", "--eval-limit", "0", "--quiet",
            "--metrics-json", metrics]


def cpu_sets(world):
    """loomrun --numa-binding exclusive's split (parallel/launcher/cpu_binding.h)."""
    cpus = sorted(os.sched_getaffinity(0))
    return [set(cpus[i * len(cpus) // world:(i + 1) * len(cpus) // world]) for i in range(world)]


def loom_ddp(args, env, tmp, shared_memory=True, bound=False):
    metrics = os.path.join(tmp, "ddp.json")
    env = dict(env, LOOM_GLOO_SHM="1" if shared_memory else "0")
    binding = ["--numa-binding", "exclusive"] if bound else []
    run([args.loomrun, "--standalone", "--nproc_per_node", str(args.world_size), *binding, args.train, "--mode", "ddp",
         *loom_args(args, metrics)], env)
    with open(metrics) as f:
        step = json.load(f)["median_step_s"]
    return args.world_size * args.batch_size / step


def loom_ddp_tcp(args, env, tmp):
    return loom_ddp(args, env, tmp, shared_memory=False)


def loom_ddp_bound(args, env, tmp):
    return loom_ddp(args, env, tmp, bound=True)


def loom_independent_bound(args, env, tmp):
    return loom_independent(args, env, tmp, bound=True)


def loom_independent(args, env, tmp, bound=False):
    procs, files = [], []
    sets = cpu_sets(args.world_size) if bound else None
    for i in range(args.world_size):
        files.append(os.path.join(tmp, f"single{i}.json"))
        pin = (lambda cpus: (lambda: os.sched_setaffinity(0, cpus)))(sets[i]) if bound else None
        procs.append(subprocess.Popen([args.train, "--mode", "single", "--seed", str(i), *loom_args(args, files[-1])],
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=pin))
    if any(p.wait() != 0 for p in procs):
        sys.exit("bench_ddp.py: an independent train_cifar10 failed")
    steps = []
    for name in files:
        with open(name) as f:
            steps.append(json.load(f)["median_step_s"])
    # What these processes would have done had every step waited for the slowest of them
    # (as DDP's ranks do): the ceiling of any synchronous data parallelism on these cores.
    args.synchronous_ceiling = args.world_size * args.batch_size / max(steps)
    return sum(args.batch_size / step for step in steps)


def torch_ddp(args, env, tmp):
    out = run([args.torch_python, os.path.join(ROOT, "bench", "ddp_torch.py"), "--world-size", str(args.world_size),
               "--model", args.model, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
               "--port", str(free_port())], env)
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["img_per_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "tiny"])
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--steps", type=int, default=11, help="optimizer steps per run; the first is not timed")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs of each configuration")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--no-tcp", action="store_true", help="skip the loom ddp (tcp) configuration")
    parser.add_argument("--no-bound", action="store_true", help="skip the --numa-binding exclusive configurations")
    parser.add_argument("--torch-python", default="/usr/bin/python3", help="a python that imports torch ('' skips)")
    parser.add_argument("--out", help="write the table as a results file (JSON; bench/report.py renders it into docs/)")
    args = parser.parse_args()
    started = results_file.now()
    args.loomrun = os.path.join(args.build, "parallel", "loomrun")
    args.train = os.path.join(args.build, "examples", "train_cifar10")
    for exe in (args.loomrun, args.train):
        if not os.access(exe, os.X_OK):
            sys.exit(f"bench_ddp.py: {exe} not found; build loom first (meson setup build && ninja -C build)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    configs = [("loom ddp (shm)", loom_ddp), ("loom ddp (tcp)", loom_ddp_tcp), ("loom independent", loom_independent)]
    if not args.no_bound:
        if len(os.sched_getaffinity(0)) < args.world_size:
            sys.exit(f"bench_ddp.py: binding needs a CPU per rank; pass --no-bound")
        configs += [("loom ddp (shm, bound)", loom_ddp_bound), ("loom independent (bound)", loom_independent_bound)]
    if args.no_tcp:
        configs = [c for c in configs if c[0] != "loom ddp (tcp)"]
    if args.torch_python:
        configs.append(("torch ddp (gloo)", torch_ddp))
    results = {name: [] for name, _ in configs}
    ceilings = {name: [] for name, _ in configs if name.startswith("loom independent")}
    cpu_ms = {name: [] for name, _ in configs}  # CPU milliseconds per training image
    loads = []  # 1-minute load average after each run: the neighbours' share of the machine
    images = args.world_size * args.batch_size * args.steps
    print(f"# {args.world_size} processes x 1 thread, {args.model}, batch {args.batch_size}/process, "
          f"{args.steps - 1} timed steps, {args.repeat} interleaved repeats, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for name, fn in configs:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                results[name].append(fn(args, env, tmp))
                if name in ceilings:
                    ceilings[name].append(args.synchronous_ceiling)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                cpu_ms[name].append(1e3 * cpu / images)
                loads.append(os.getloadavg()[0])
                print(f"#   repeat {r + 1}: {name:26s} {results[name][-1]:8.1f} img/s  "
                      f"{cpu_ms[name][-1]:7.1f} CPU ms/img  load {loads[-1]:.2f}", flush=True)
    medians = {name: statistics.median(v) for name, v in results.items()}
    cpu = {name: statistics.median(v) for name, v in cpu_ms.items()}
    print(f"{'configuration':26s} {'img/s (median)':>15s} {'CPU ms/img':>11s}  img/s of each run")
    for name, v in results.items():
        print(f"{name:26s} {medians[name]:15.1f} {cpu[name]:11.1f}  {' '.join(f'{x:.1f}' for x in v)}")
    # Each DDP row against each independent row it can be fairly compared with: unbound
    # DDP against unbound processes; bound DDP against both (the ceiling is the better one).
    pairs = [("loom ddp (shm)", "loom independent"), ("loom ddp (tcp)", "loom independent"),
             ("loom ddp (shm, bound)", "loom independent"), ("loom ddp (shm, bound)", "loom independent (bound)")]
    for name, base in pairs:
        if name not in medians or base not in medians:
            continue
        # Each repeat runs the configurations back to back, so the ratio within a repeat
        # sees (nearly) the same machine; its median resists the drift of a shared host's
        # speed over minutes better than the ratio of the two medians does.
        paired = statistics.median(d / i for d, i in zip(results[name], results[base]))
        print(f"{name} / {base} = {medians[name] / medians[base]:.3f}  "
              f"median of per-repeat ratios {paired:.3f}; CPU per image: {cpu[name] / cpu[base]:.3f}x")
    # Each DDP row against its independent processes' synchronous ceiling: how much of what
    # lockstep allows on these cores DDP reaches (the rest of the gap above is the cores'
    # own difference in speed, which no synchronous method can recover).
    # And the ceiling against the independent processes themselves: the most that any
    # synchronous method (a free all_reduce included) could reach of them here.
    for base, ceiling in ceilings.items():
        paired = statistics.median(c / i for c, i in zip(ceiling, results[base]))
        print(f"synchronous ceiling of {base} / {base} = {paired:.3f} (median of per-repeat ratios): "
              f"the slower process's pace against both at their own")
    for name, base in [("loom ddp (shm)", "loom independent"), ("loom ddp (shm, bound)", "loom independent (bound)")]:
        if name in medians and base in ceilings:
            paired = statistics.median(d / c for d, c in zip(results[name], ceilings[base]))
            print(f"{name} / synchronous ceiling of {base} ({statistics.median(ceilings[base]):.1f} img/s) = "
                  f"{paired:.3f} (median of per-repeat ratios)")
    for name in ("loom ddp (shm)", "loom ddp (tcp)", "loom ddp (shm, bound)"):
        if name in medians and "torch ddp (gloo)" in medians:
            print(f"{name} / torch ddp (gloo) = {medians[name] / medians['torch ddp (gloo)']:.3f}")
    load = (f"load average (1 min) after the runs: median {statistics.median(loads):.2f}, "
            f"min {min(loads):.2f}, max {max(loads):.2f} on {os.cpu_count()} cores")
    print(load)
    if args.out:
        results_file.write(args.out, results_document(args, results, cpu, medians, load, started))


def results_document(args, results, cpu, medians, load, started):
    w = args.world_size
    labels = {"loom ddp (shm)": "loom ddp, gloo over shared memory",
              "loom ddp (tcp)": "loom ddp, gloo over TCP (`LOOM_GLOO_SHM=0`)",
              "loom independent": f"loom, {w} independent single processes",
              "loom ddp (shm, bound)": "loom ddp, shared memory, `loomrun --numa-binding exclusive`",
              "loom independent (bound)": f"loom, {w} independent processes, each bound to its core",
              "torch ddp (gloo)": "PyTorch DDP, gloo"}
    rows = [{"configuration": labels[name], "img_per_s": round(medians[name], 1), "cpu_ms_per_image": round(cpu[name], 1),
             "img_per_s_runs": [round(x, 1) for x in runs]} for name, runs in results.items()]
    # One comparison, one rule (as bench_modes.py's): the ratio of the medians shown, so that
    # it follows from the table (bench/docs_figures.py checks it), with the per-repeat range.
    named = [("loom ddp (shm, bound)", "loom independent (bound)"), ("loom ddp (shm)", "loom independent"),
             ("loom ddp (shm)", "loom ddp (tcp)")]
    ratios = []
    for x, y in named:
        if x in results and y in results:
            each = [a / b for a, b in zip(results[x], results[y])]
            ratios.append({"name": f"{labels[x]} / {labels[y]} (ratio of the medians; repeats "
                                   f"{min(each):.2f}-{max(each):.2f})", "format": ".3f",
                           "value": round(round(medians[x], 1) / round(medians[y], 1), 3)})
    columns = [{"key": "configuration", "title": "configuration"},
               {"key": "img_per_s", "title": "img/s (median)", "format": ".1f"},
               {"key": "cpu_ms_per_image", "title": "CPU ms / image", "format": ".1f"},
               {"key": "img_per_s_runs", "title": "img/s of each repeat", "format": ".1f"}]
    title = (f"DDP against independent processes ({args.model}, batch {args.batch_size} per process, {w} processes "
             f"× 1 thread, {args.steps - 1} timed steps, {args.repeat} interleaved repeats)")
    return results_file.document(title, "bench_ddp.py", columns, rows, ratios, started, conditions=load[0].upper() + load[1:] + ".")


if __name__ == "__main__":
    main()
