"""PyTorch's throughput for the ResNet18-CIFAR steps bench_train measures, so loom has a reference.

    /usr/bin/python3 bench/bench_train_torch.py --mode=train --batch=128 --warmup=2 --steps=5 --threads=2
    python3 bench/bench_train_torch.py --device=cuda --batch=512 --amp=bf16 --warmup=5 --steps=20

On the CPU it prints one line, `result MODE BATCH IMG_PER_S MAX_RSS_KB`, which bench_train
parses; the process measures one (mode, batch) so that its peak RSS belongs to that
measurement. On the CPU, --amp=bf16 runs forward + loss under torch.autocast("cpu",
torch.bfloat16) with model and images in channels_last (oneDNN's bfloat16 convolutions
want NHWC; in NCHW each conv pays a reorder): how PyTorch users run CPU mixed precision,
and bench_train's bf16 rows (Note [bfloat16 rows] in bench_train.cpp). With --device=cuda it prints `result MODE BATCH PRECISION IMG_PER_S MEDIAN_MS
PEAK_MIB`, as bench/bench_train_gpu.cpp does (bench_train_gpu.py parses both): PRECISION
is fp32 (TF32 off in matmul and cuDNN), tf32 (--tf32: on in both), bf16 or fp16
(--amp: torch.autocast around forward + loss; fp16 adds a GradScaler). Each step is
timed by a pair of CUDA events with no host synchronisation between steps, and layouts
stay channels-first (NCHW), cudnn.benchmark off -- loom's choices.
Same protocol as bench_train's loom worker:
  train: model.train(); forward, CrossEntropyLoss, zero_grad(set_to_none), backward,
         SGD(lr 0.1, momentum 0.9, weight_decay 5e-4).step()
  infer: model.eval() under torch.no_grad(); forward only
on one synthetic batch kept in memory (standard-normal images, uniform labels); the
number is batch / median step time over --steps timed steps after --warmup steps.
torchvision may be missing, so the model is defined here, matching nn::resnet18 in
loom: 3x3 stride-1 stem, no max-pool, BasicBlocks [2, 2, 2, 2] of widths 64..512,
1x1-conv + BN downsample, adaptive average pool, fc; torchvision's initialisation.
"""
import argparse
import resource
import statistics
import sys
import time


def build_model(nn):
    class BasicBlock(nn.Module):
        def __init__(self, in_planes, planes, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)  # torchvision's choice, and PyTorch users'
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or in_planes != planes:
                self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out += x if self.downsample is None else self.downsample(x)  # as torchvision
            return self.relu(out)

    class ResNet(nn.Module):
        def __init__(self, blocks=(2, 2, 2, 2), widths=(64, 128, 256, 512), num_classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU(inplace=True)
            layers, planes_in = [], widths[0]
            for s, (count, width) in enumerate(zip(blocks, widths)):
                stage = []
                for b in range(count):
                    stage.append(BasicBlock(planes_in, width, 2 if s > 0 and b == 0 else 1))
                    planes_in = width
                layers.append(nn.Sequential(*stage))
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(widths[3], num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["train", "infer"], default="train")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none",
                        help="autocast dtype around forward + loss (cpu: bf16 only, with channels_last)")
    parser.add_argument("--tf32", action="store_true", help="cuda: TF32 in matmuls and cuDNN convolutions")
    args = parser.parse_args()
    if args.device == "cpu" and (args.amp == "fp16" or args.tf32):
        parser.error("--amp=fp16 and --tf32 are for --device=cuda (the CPU takes --amp=bf16)")
    try:
        import torch
        import torch.nn as nn
    except ImportError:
        sys.exit(f"bench_train_torch.py: PyTorch is not importable by {sys.executable}; "
                 "install it (Debian: apt-get install python3-torch) or pick another python")
    # Debian's build starts with one thread whatever OMP_NUM_THREADS says.
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"mkldnn {torch.backends.mkldnn.is_available()}", file=sys.stderr)

    if args.device == "cuda":
        return run_cuda(torch, nn, args)
    model = build_model(nn)
    images = torch.randn(args.batch, 3, 32, 32)
    labels = torch.randint(0, 10, (args.batch,))
    bf16 = args.amp == "bf16"
    if bf16:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    if args.mode == "train":
        model.train()
        criterion = nn.CrossEntropyLoss()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

        def step():
            with autocast():
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss.item()
    else:
        model.eval()

        def step():
            with torch.no_grad(), autocast():
                model(images).sum().item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    img_per_s = args.batch / statistics.median(times)
    max_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"result {args.mode} {args.batch} {img_per_s:.2f} {max_rss_kb}", flush=True)


def run_cuda(torch, nn, args):
    if not torch.cuda.is_available():
        sys.exit("bench_train_torch.py: --device=cuda but torch.cuda.is_available() is False")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32  # PyTorch's default is True: fp32 means fp32 here
    torch.backends.cudnn.benchmark = False       # loom picks by cuDNN's heuristics too
    precision = args.amp if args.amp != "none" else ("tf32" if args.tf32 else "fp32")
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp, torch.float32)
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, cudnn {torch.backends.cudnn.version()}, "
          f"precision {precision}", file=sys.stderr)
    device = torch.device("cuda")
    model = build_model(nn).to(device)
    images = torch.randn(args.batch, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (args.batch,), device=device)
    criterion = nn.CrossEntropyLoss()
    if args.mode == "train":
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "fp16")

        def step():
            with torch.autocast("cuda", dtype=amp_dtype, enabled=args.amp != "none"):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    else:
        model.eval()

        def step():
            with torch.no_grad(), torch.autocast("cuda", dtype=amp_dtype, enabled=args.amp != "none"):
                model(images)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.steps)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    median_ms = statistics.median(start.elapsed_time(end) for start, end in events)
    peak_mib = torch.cuda.max_memory_allocated() / 2**20
    print(f"result {args.mode} {args.batch} {precision} {args.batch / (median_ms / 1e3):.2f} {median_ms:.3f} "
          f"{peak_mib:.0f}", flush=True)


if __name__ == "__main__":
    main()
