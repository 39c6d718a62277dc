// bench_train: ResNet18-CIFAR training and inference throughput, loom side by side with
// PyTorch, plus the peak memory of each and the data pipeline's augmentation rate.
//
//   build/bench/bench_train                      # batch 128 and 32, train + infer, vs PyTorch
//   build/bench/bench_train --no-torch           # loom only
//   build/bench/bench_train --batches=128 --steps=8 --repeat=3 --python=/usr/bin/python3
//   build/bench/bench_train --amps=bf16 --modes=train   # the bfloat16 rows only
//
// One measurement = one process, so that its peak RSS (getrusage ru_maxrss) belongs to it:
// loom runs in a child copy of this program (--worker), PyTorch in bench_train_torch.py.
// For each (mode, batch, amp) the three runs go back to back, and with --repeat=N the
// N rounds interleave (torch, tuned, loom, torch, tuned, loom, ...), so all see the same
// machine load:
//   torch        PyTorch as installed (glibc's default malloc settings)
//   torch tuned  GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=16G,
//                glibc then keeps freed memory instead of unmapping it (see Note [PyTorch
//                and page faults] in bench_ops.cpp): PyTorch without its page-fault cost
//   loom         its caching allocator does the same by design (Note [Caching allocator])
// A step is the one users write: train = forward, CrossEntropyLoss, zero_grad, backward,
// SGD(momentum 0.9, weight decay 5e-4) step; infer = eval() forward under no_grad.
//
// Note [bfloat16 rows]
// --amps=none,bf16 (the default) measures every (mode, batch) twice: in float32, and with
// the forward and the loss under CPU autocast to bfloat16 -- loom's `train_cifar10 --amp
// bf16` (autograd/autocast.h), and PyTorch's torch.autocast("cpu", torch.bfloat16) with
// model and input in channels_last, the layout its oneDNN bfloat16 convolutions want
// (NCHW costs it a reorder per conv); loom's bf16 rows feed channels-last images too, as
// train_cifar10 --amp bf16 does (Note [Channels-last activations]). A bf16 row adds "vs f32": loom bf16 over loom
// float32 at the same mode and batch; its "vs torch"/"vs tuned" compare with PyTorch's
// bf16 runs, so one invocation reads both ratios the mixed-precision work is judged by.
// Data
// is one synthetic batch held in memory, so only the model is timed. Each number is the
// batch size over the median step time of --steps timed steps after --warmup steps (the
// first builds oneDNN plans and fills the allocator), and with --repeat=N the median of N
// such processes. Ratios are loom/torch: > 1 means loom is faster (or, for RSS, larger).
//
// `--worker --profile --mode=train --batch=128` prints where loom's step goes: each
// kernel's dispatch slot is wrapped by a timer (Note [Kernel profile]).
#include <omp.h>           // defines: omp_set_num_threads
#include <sys/resource.h>  // defines: getrusage, for the peak RSS

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include "autograd/autocast.h"     // defines: autocast::Guard, for --amp=bf16
#include "core/cpu/bf16_path.h"     // defines: bf16_autocast_pays
#include "core/cpu/kernel_benchmark.h"  // defines: backends::cpu::set_benchmark (--conv-benchmark)
#include "autograd/grad_mode.h"    // defines: NoGradGuard
#include "autograd/ops.h"          // defines: randn, randint
#include "core/allocator.h"        // defines: memory_stats
#include "core/cpu/activation_layout.h"  // defines: cpu::activation_format (Note [Channels-last on AVX2])
#include "core/kernels.h"          // defines: the dispatch stubs --profile wraps
#include "data/synthetic_cifar.h"  // defines: SyntheticCIFAR
#include "data/transforms.h"       // defines: Compose, RandomCrop, ...
#include "nn/airbench.h"  // defines: airbench94 (--model=airbench94)
#include "nn/loss.h"               // defines: CrossEntropyLoss
#include "nn/optim/sgd.h"          // defines: SGD
#include "nn/resnet.h"             // defines: resnet18

namespace {

using namespace loom;
using Clock = std::chrono::steady_clock;

constexpr const char* kTunedEnv = "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184";

struct Options {
  std::vector<int64_t> batches = {128, 32};
  std::vector<std::string> modes = {"train", "infer"};
  std::vector<std::string> amps = {"none", "bf16"};  // Note [bfloat16 rows]
  int warmup = 2;
  int steps = 5;
  int repeat = 1;
  int threads = 2;
  bool torch = true;
  bool augment = true;
  std::string python;
  // --worker: measure one (mode, batch) of loom in this process and print a result line.
  bool worker = false;
  bool profile = false;  // with --worker: time per kernel
  std::string model = "resnet18";  // with --worker: resnet18, or airbench94 (the speedrun's net, docs/speedrun.md)
  // loom::backends::cpu::benchmark (Note [Kernel autotuning]): on, or off for the fixed
  // rules; the warm-up steps absorb the search.
  std::string conv_benchmark = "off";  // as every loom program: Note [Same command, same model]
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

[[noreturn]] void usage(const char* arg) {
  std::fprintf(stderr,
               "bench_train: unknown argument '%s'\n"
               "usage: bench_train [--batches=128,32] [--modes=train,infer] [--amps=none,bf16] [--warmup=N] [--steps=N]\n"
               "                   [--repeat=N] [--threads=N] [--python=PYTHON] [--no-torch] [--no-augment] [--conv-benchmark=on|off]\n"
               "       bench_train --worker [--profile] [--model=resnet18|airbench94] [--conv-benchmark=on|off] --mode=train|infer --batch=N [--amp=none|bf16] [--warmup=N]\n"
               "                   [--steps=N]\n"
               "  PYTHON runs bench/bench_train_torch.py (default $LOOM_PYTHON, else /usr/bin/python3)\n",
               arg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  if (const char* python = std::getenv("LOOM_PYTHON")) o.python = python;
  else o.python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* flag) -> std::optional<std::string> {
      size_t n = std::strlen(flag);
      if (arg.compare(0, n, flag) == 0) return arg.substr(n);
      return std::nullopt;
    };
    if (auto v = value("--batches=")) {
      o.batches.clear();
      for (const auto& b : split(*v)) o.batches.push_back(std::max(1, std::atoi(b.c_str())));
    } else if (auto v = value("--batch=")) o.batches = {std::max(1, std::atoi(v->c_str()))};
    else if (auto v = value("--modes=")) o.modes = split(*v);
    else if (auto v = value("--mode=")) o.modes = {*v};
    else if (auto v = value("--amps=")) o.amps = split(*v);
    else if (auto v = value("--amp=")) o.amps = {*v};
    else if (auto v = value("--warmup=")) o.warmup = std::max(1, std::atoi(v->c_str()));
    else if (auto v = value("--steps=")) o.steps = std::max(1, std::atoi(v->c_str()));
    else if (auto v = value("--repeat=")) o.repeat = std::max(1, std::atoi(v->c_str()));
    else if (auto v = value("--threads=")) o.threads = std::max(1, std::atoi(v->c_str()));
    else if (auto v = value("--python=")) o.python = *v;
    else if (arg == "--no-torch") o.torch = false;
    else if (arg == "--no-augment") o.augment = false;
    else if (arg == "--worker") o.worker = true;
    else if (arg == "--profile") o.profile = true;
    else if (auto v = value("--model=")) o.model = *v;
    else if (auto v = value("--conv-benchmark=")) o.conv_benchmark = *v;
    else usage(argv[i]);
  }
  for (const auto& m : o.modes)
    if (m != "train" && m != "infer") usage(("--modes=" + m).c_str());
  if (o.conv_benchmark != "on" && o.conv_benchmark != "off") usage(("--conv-benchmark=" + o.conv_benchmark).c_str());
  for (const auto& a : o.amps)
    if (a != "none" && a != "bf16") usage(("--amps=" + a).c_str());
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t max_rss_kb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;  // KiB on Linux
}

// ---- the kernel profile --------------------------------------------------------------------

// Note [Kernel profile]
// Every kernel is called through its DispatchStub (core/dispatch.h), so replacing the
// CPU slot with a wrapper that times the original call sees every kernel a step runs,
// without touching the library. Kernels that call kernels (a strided input made
// contiguous by copy_kernel) count twice; whatever the step spends outside all kernels
// (autograd bookkeeping, allocation, the OpenMP fork/join between kernels) is the
// difference between the step time and the kernels' sum.
struct KernelTime {
  double seconds = 0;
  int64_t calls = 0;
};
std::map<std::string, KernelTime> g_kernel_times;

template <auto* Stub, typename Fn> struct TimedKernel;
template <auto* Stub, typename... Args>
struct TimedKernel<Stub, void (*)(Args...)> {
  static inline void (*original)(Args...) = nullptr;
  static void call(Args... args) {
    auto start = Clock::now();
    original(std::forward<Args>(args)...);
    KernelTime& t = g_kernel_times[Stub->name];
    t.seconds += seconds_since(start);
    t.calls += 1;
  }
  static void install() {
    original = (*Stub)(Device());
    Stub->set(DeviceType::CPU, &call);
  }
};

template <auto* Stub>
void time_kernel() {
  TimedKernel<Stub, std::remove_reference_t<decltype(Stub->table[0])>>::install();
}

void install_kernel_timers() {
  time_kernel<&unary_kernel>();
  time_kernel<&binary_kernel>();
  time_kernel<&threshold_backward_kernel>();
  time_kernel<&fill_kernel>();
  time_kernel<&copy_kernel>();
  time_kernel<&reduce_kernel>();
  time_kernel<&max_min_dim_kernel>();
  time_kernel<&mm_kernel>();
  time_kernel<&conv2d_forward_kernel>();
  time_kernel<&conv2d_backward_kernel>();
  time_kernel<&adaptive_avg_pool2d_forward_kernel>();
  time_kernel<&adaptive_avg_pool2d_backward_kernel>();
  time_kernel<&batch_norm_forward_kernel>();
  time_kernel<&batch_norm_backward_kernel>();
  time_kernel<&log_softmax_forward_kernel>();
  time_kernel<&log_softmax_backward_kernel>();
  time_kernel<&nll_loss_forward_kernel>();
  time_kernel<&nll_loss_backward_kernel>();
  time_kernel<&optim::sgd_update_kernel>();
}

void print_kernel_profile(int steps, double step_seconds) {
  std::vector<std::pair<std::string, KernelTime>> rows(g_kernel_times.begin(), g_kernel_times.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  std::fprintf(stderr, "#   %-36s %10s %8s %7s\n", "kernel", "ms/step", "calls", "share");
  for (const auto& [name, t] : rows) {
    total += t.seconds;
    std::fprintf(stderr, "#   %-36s %10.1f %8lld %6.1f%%\n", name.c_str(), 1e3 * t.seconds / steps,
                 static_cast<long long>(t.calls / steps), 100 * t.seconds / steps / step_seconds);
  }
  std::fprintf(stderr, "#   %-36s %10.1f %8s %6.1f%%\n", "outside kernels", 1e3 * (step_seconds - total / steps), "",
               100 * (1 - total / steps / step_seconds));
}

// ---- the loom worker ----------------------------------------------------------------------

// One (mode, batch) of loom: prints `result MODE BATCH IMG_PER_S MAX_RSS_KB`, and on
// stderr where a step's time goes and what the caching allocator holds.
// The images' layout: loom's choice for `dtype` on this CPU, or LOOM_BENCH_MEMORY_FORMAT's.
MemoryFormat bench_memory_format(DType dtype) {
  const char* value = std::getenv("LOOM_BENCH_MEMORY_FORMAT");
  if (value == nullptr || *value == '\0') return cpu::activation_format(dtype);
  if (std::strcmp(value, "contiguous") == 0) return MemoryFormat::Contiguous;
  if (std::strcmp(value, "channels_last") == 0) return MemoryFormat::ChannelsLast;
  std::fprintf(stderr, "LOOM_BENCH_MEMORY_FORMAT: expected 'contiguous' or 'channels_last', got '%s'\n", value);
  std::exit(2);
}

int run_worker(const Options& o) {
  omp_set_num_threads(o.threads);
  backends::cpu::set_benchmark(o.conv_benchmark == "on");
  manual_seed(0);
  const std::string mode = o.modes.at(0);
  const int64_t batch = o.batches.at(0);
  // Note [bfloat16 rows]; float32 where the CPU has no bfloat16 arithmetic, as train_cifar10
  // (Note [bf16 autocast where the CPU has no bfloat16 arithmetic]).
  const bool bf16 = o.amps.at(0) == "bf16" && cpu::bf16_autocast_pays();
  auto autocast_scope = [bf16] {
    return bf16 ? std::make_unique<autocast::Guard>(DeviceType::CPU, kBFloat16) : nullptr;
  };
  LOOM_CHECK(o.model == "resnet18" || o.model == "airbench94", "bench_train: --model=resnet18 or airbench94, got '",
             o.model, "'");
  std::shared_ptr<nn::Module> model = o.model == "airbench94" ? std::shared_ptr<nn::Module>(nn::airbench94())
                                                              : std::shared_ptr<nn::Module>(nn::resnet18(10));
  Tensor images = randn({batch, 3, 32, 32});
  // The layout in which loom's convolutions need no reorders (Note [Channels-last on AVX2],
  // core/cpu/activation_layout.h), as train_cifar10 --memory-format auto: channels-last
  // under bf16 (as PyTorch's bf16 rows, Note [bfloat16 rows]) and on AVX2, NCHW otherwise.
  // LOOM_BENCH_MEMORY_FORMAT=contiguous|channels_last overrides it, to measure the other.
  images = images.contiguous(bench_memory_format(bf16 ? kBFloat16 : kFloat32));
  Tensor labels = randint(0, 10, {batch}, TensorOptions(kInt64));
  nn::CrossEntropyLoss criterion;
  optim::SGD optimizer(model->parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});

  std::vector<double> total, forward, backward, update;
  std::function<void()> step;
  if (mode == "train") {
    model->train();
    step = [&] {
      auto t0 = Clock::now();
      Tensor loss;
      {
        auto scope = autocast_scope();  // forward and loss only, as train_cifar10 --amp
        loss = criterion((*model)(images), labels);
      }
      auto t1 = Clock::now();
      optimizer.zero_grad();
      loss.backward();
      auto t2 = Clock::now();
      optimizer.step();
      (void)loss.item<float>();
      auto t3 = Clock::now();
      forward.push_back(std::chrono::duration<double>(t1 - t0).count());
      backward.push_back(std::chrono::duration<double>(t2 - t1).count());
      update.push_back(std::chrono::duration<double>(t3 - t2).count());
    };
  } else {
    model->eval();
    step = [&] {
      NoGradGuard no_grad;
      auto scope = autocast_scope();
      (void)sum((*model)(images)).to(kFloat32).item<float>();  // bf16 logits sum to bf16 on the CPU
    };
  }
  for (int i = 0; i < o.warmup; ++i) step();
  forward.clear(), backward.clear(), update.clear();
  if (o.profile) install_kernel_timers();
  const int64_t system_before = memory_stats(Device()).system_allocations;
  for (int i = 0; i < o.steps; ++i) {
    auto start = Clock::now();
    step();
    total.push_back(seconds_since(start));
  }
  const AllocatorStats stats = memory_stats(Device());
  if (o.profile) {
    double sum = 0;
    for (double t : total) sum += t;
    print_kernel_profile(o.steps, sum / o.steps);
  }
  if (mode == "train") {
    std::fprintf(stderr, "#   loom train %lld%s: forward %.0f ms, backward %.0f ms, optimizer %.0f ms (medians)\n",
                 static_cast<long long>(batch), bf16 ? " bf16" : "", 1e3 * median(forward), 1e3 * median(backward),
                 1e3 * median(update));
  }
  std::fprintf(stderr,
               "#   loom %s %lld: allocator reserved %.0f MiB, peak allocated %.0f MiB, "
               "%lld system allocations during the timed steps\n",
               mode.c_str(), static_cast<long long>(batch), stats.reserved_bytes / 1048576.0,
               stats.peak_allocated_bytes / 1048576.0, static_cast<long long>(stats.system_allocations - system_before));
  std::printf("result %s %lld %.2f %lld\n", mode.c_str(), static_cast<long long>(batch),
              static_cast<double>(batch) / median(total), static_cast<long long>(max_rss_kb()));
  return 0;
}

// ---- the driver ---------------------------------------------------------------------------

struct Result {
  double img_per_s = 0;
  int64_t rss_kb = 0;
};

// Runs a command that prints a `result` line; its other output goes to stderr.
std::optional<Result> run_measurement(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::optional<Result> result;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    char mode[16];
    long long batch = 0, rss = 0;
    double img = 0;
    if (std::sscanf(line, "result %15s %lld %lf %lld", mode, &batch, &img, &rss) == 4) result = Result{img, rss};
    else std::fputs(line, stderr);
  }
  if (pclose(pipe) != 0 || !result) {
    std::fprintf(stderr, "bench_train: '%s' failed\n", command.c_str());
    return std::nullopt;
  }
  return result;
}

// The median rate and the largest peak RSS over --repeat processes of each command, the
// commands taking turns (one process of each per round) so that a change in machine load
// during the run hits all of them alike. Empty entries are skipped; nullopt if one fails.
std::optional<std::vector<Result>> measure_interleaved(const Options& o, const std::vector<std::string>& commands) {
  std::vector<std::vector<double>> rates(commands.size());
  std::vector<Result> results(commands.size());
  for (int r = 0; r < o.repeat; ++r) {
    for (size_t c = 0; c < commands.size(); ++c) {
      if (commands[c].empty()) continue;
      auto result = run_measurement(commands[c]);
      if (!result) return std::nullopt;
      rates[c].push_back(result->img_per_s);
      results[c].rss_kb = std::max(results[c].rss_kb, result->rss_kb);
    }
  }
  for (size_t c = 0; c < commands.size(); ++c)
    if (!rates[c].empty()) results[c].img_per_s = median(rates[c]);
  return results;
}

std::string self_path() {
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  LOOM_CHECK(n > 0, "bench_train: cannot read /proc/self/exe to start the loom worker");
  path[n] = '\0';
  return path;
}

// Images per second that one thread turns from uint8 CIFAR records into a normalised,
// augmented float batch: what one DataLoader worker can feed.
double augmentation_rate() {
  namespace T = data::transforms;
  auto transform = std::make_shared<T::Compose>(T::RandomCrop(32, 4), T::RandomHorizontalFlip(), T::ToTensor(),
                                                T::Normalize({0.4914, 0.4822, 0.4465}, {0.2023, 0.1994, 0.2010}));
  data::SyntheticCIFAR dataset(4096, /*seed=*/3, transform);
  const int64_t batch = 128;
  std::vector<int64_t> indices(static_cast<size_t>(batch));
  int64_t images = 0;
  auto start = Clock::now();
  for (int64_t epoch = 0; seconds_since(start) < 1.0; ++epoch) {
    for (int64_t first = 0; first + batch <= dataset.size(); first += batch) {
      for (int64_t i = 0; i < batch; ++i) indices[static_cast<size_t>(i)] = first + i;
      images += dataset.get_batch(indices, {0, epoch}).size();
    }
  }
  return static_cast<double>(images) / seconds_since(start);
}

std::string mib(int64_t kb) {
  char s[32];
  std::snprintf(s, sizeof s, "%.0f", kb / 1024.0);
  return s;
}

int run_driver(const Options& o) {
  std::printf("bench_train: ResNet18-CIFAR, %d threads, %d warm-up + %d timed steps per process, "
              "median of %d process(es); img/s (higher is better), peak RSS in MiB\n",
              o.threads, o.warmup, o.steps, o.repeat);
  if (o.torch) std::printf("PyTorch: %s " LOOM_BENCH_DIR "/bench_train_torch.py; tuned = %s\n", o.python.c_str(), kTunedEnv);
  std::printf("\n%-6s %5s %5s %10s %8s %7s", "mode", "batch", "amp", "loom", "RSS", "vs f32");
  if (o.torch) std::printf(" %10s %8s %10s %8s %10s %10s %9s", "torch", "RSS", "tuned", "RSS", "vs torch", "vs tuned",
                           "RSS ratio");
  std::printf("\n");
  std::fflush(stdout);

  std::map<int64_t, double> train_rate;
  std::map<std::pair<std::string, int64_t>, double> f32_rate;  // loom float32, for "vs f32"
  const std::string self = self_path();
  for (int64_t batch : o.batches) {
    for (const std::string& mode : o.modes) {
      for (const std::string& amp : o.amps) {
        const std::string args = " --mode=" + mode + " --batch=" + std::to_string(batch) +
                                 " --warmup=" + std::to_string(o.warmup) + " --steps=" + std::to_string(o.steps) +
                                 " --threads=" + std::to_string(o.threads);
        const std::string loom_args = args + " --conv-benchmark=" + o.conv_benchmark;
        std::string script;
        if (o.torch) script = o.python + " " LOOM_BENCH_DIR "/bench_train_torch.py" + args + " --amp=" + amp;
        auto results = measure_interleaved(
            o, {script, o.torch ? std::string(kTunedEnv) + " " + script : "", self + " --worker" + loom_args + " --amp=" + amp});
        if (!results) return 1;
        const Result &torch = (*results)[0], &tuned = (*results)[1], &loom = (*results)[2];
        if (mode == "train" && amp == "none") train_rate[batch] = loom.img_per_s;
        if (amp == "none") f32_rate[{mode, batch}] = loom.img_per_s;
        std::printf("%-6s %5lld %5s %10.1f %8s", mode.c_str(), static_cast<long long>(batch), amp.c_str(),
                    loom.img_per_s, mib(loom.rss_kb).c_str());
        auto f32 = f32_rate.find({mode, batch});
        if (amp != "none" && f32 != f32_rate.end()) std::printf(" %6.2fx", loom.img_per_s / f32->second);
        else std::printf(" %7s", "");
        if (o.torch) {
          std::printf(" %10.1f %8s %10.1f %8s %9.2fx %9.2fx %8.2fx", torch.img_per_s, mib(torch.rss_kb).c_str(),
                      tuned.img_per_s, mib(tuned.rss_kb).c_str(), loom.img_per_s / torch.img_per_s,
                      loom.img_per_s / tuned.img_per_s,
                      static_cast<double>(loom.rss_kb) / static_cast<double>(std::min(torch.rss_kb, tuned.rss_kb)));
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }
  std::printf("(vs f32: loom bf16 over loom float32; bf16 rows compare with PyTorch's CPU bf16 autocast, "
              "channels_last: Note [bfloat16 rows])\n");
  if (o.torch) std::printf("(RSS ratio: loom's peak RSS over the smaller of PyTorch's two)\n");

  if (o.augment) {
    omp_set_num_threads(1);  // a DataLoader worker is one thread
    const double rate = augmentation_rate();
    std::printf("\naugmentation (RandomCrop 32 pad 4 + flip + ToTensor + Normalize, batch 128), one worker thread: "
                "%.0f img/s\n", rate);
    for (const auto& [batch, train] : train_rate)
      std::printf("  = %.0fx what loom's training consumes at batch %lld (%.1f img/s)\n", rate / train,
                  static_cast<long long>(batch), train);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  return options.worker ? run_worker(options) : run_driver(options);
}
