"""PyTorch's time for the convolutions bench_ops measures, so loom has a reference.

    python3 bench/bench_conv_torch.py --batch=128 --runs=5 --threads=2

Prints one line per shape, `conv C HW fwd_ms bwd_ms`, which bench_ops --torch parses
(it asks for one shape at a time with --channels/--size).
Same protocol as bench_ops: 3x3 kernel, stride 1, padding 1, in = out channels, no bias;
forward is F.conv2d, backward computes the input and weight gradients; each number is
the median of --runs timed runs after one warm-up.
"""
import argparse
import statistics
import sys
import time

SHAPES = [(64, 32), (128, 16), (256, 8), (512, 4)]


def median_ms(runs, fn):
    fn()  # warm-up: oneDNN primitive creation, allocator
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0: PyTorch's default")
    parser.add_argument("--channels", type=int, default=0, help="only this shape (with --size)")
    parser.add_argument("--size", type=int, default=0)
    args = parser.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        sys.exit(f"bench_conv_torch.py: PyTorch is not importable by {sys.executable}; "
                 "install it (Debian: apt-get install python3-torch) or pick another python")
    if args.threads > 0:
        # Debian's build starts with one thread whatever OMP_NUM_THREADS says.
        torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"mkldnn {torch.backends.mkldnn.is_available()}", file=sys.stderr)

    shapes = [(args.channels, args.size)] if args.channels > 0 else SHAPES
    for channels, size in shapes:
        x = torch.randn(args.batch, channels, size, size, requires_grad=True)
        w = torch.randn(channels, channels, 3, 3, requires_grad=True)
        with torch.no_grad():
            fwd = median_ms(args.runs, lambda: F.conv2d(x, w, padding=1))
        y = F.conv2d(x, w, padding=1)
        grad_y = torch.randn_like(y)
        bwd = median_ms(args.runs, lambda: torch.autograd.grad(y, (x, w), grad_y, retain_graph=True))
        print(f"conv {channels} {size} {fwd:.3f} {bwd:.3f}", flush=True)


if __name__ == "__main__":
    main()
