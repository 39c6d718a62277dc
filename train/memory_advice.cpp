#include "train/memory_advice.h"

#include <omp.h>  // defines: omp_set_num_threads (each rank one thread, as a process of the run would be)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>  // defines: std::jthread
#include <vector>

#include "core/allocator.h"                // defines: reset_peak_memory_stats
#include "parallel/comm/new_group.h"       // defines: World (ranks as threads)
#include "parallel/comm/process_group.h"   // defines: is_initialized, default_store, get_rank (who advises)
#include "parallel/store/tcp_store.h"      // defines: TCPStore (the threads' rendezvous)
#include "train/degrees.h"                 // defines: needs_process_group
#include "train/estimate_memory.h"         // defines: estimate_memory_of, DeviceMemoryEstimate

namespace loom::training {
namespace {

// The alternatives' devices start at least here, and past every device the failed run uses
// (Note [Advice after an out-of-memory error]); virtual CPU devices cost nothing until used.
constexpr int kFirstAdviceDevice = 32;
// A rank that fails leaves the others in a collective: they stop after this.
constexpr std::chrono::milliseconds kRankTimeout = std::chrono::seconds(60);

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct Alternative {
  std::string flags;  // what the user would change on the command line
  TrainConfig config;
  int ranks;
};

// Each rank's estimate (one device each; one rank may hold several devices in one process:
// --mode dp, mp), or the first rank's error.
struct RankEstimates {
  std::vector<DeviceMemoryEstimate> devices;
  std::string error;
};

// A rank thread's error that says why, rather than that it waited: when one rank fails, the
// others time out in their next collective, and the lowest rank is often one of those.
bool is_timeout(const std::string& error) { return error.find("timed out after") != std::string::npos; }

// `config` estimated over `ranks` threads, rank r on cpu:(first_device + r * span ...).
RankEstimates estimate_in_threads(const TrainConfig& config, int ranks, int first_device) {
  auto server = std::make_shared<distributed::TCPStore>("127.0.0.1", 0, /*is_server=*/true, kRankTimeout);
  std::vector<std::vector<DeviceMemoryEstimate>> per_rank(static_cast<size_t>(ranks));
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  // A rank of one process may span devices (dp, mp); each rank gets room for as many.
  const int span = static_cast<int>(std::max({config.parallel.dp_devices, config.parallel.mp_devices, int64_t{2}}));
  // The cached blocks an earlier alternative left would serve this one's requests (split
  // to fit: Note [Caching allocator]) and change its figures: every estimate starts from
  // an empty cache, as a fresh process does.
  empty_cache(DeviceType::CPU);
  {
    std::vector<std::jthread> threads;  // joined however this scope is left
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          omp_set_num_threads(1);
          TrainConfig c = config;
          const int first = first_device + r * span;
          c.training.device = "cpu:" + std::to_string(first);
          for (int d = first; d < first + span; ++d) {  // no budget, and this estimate's peak only
            set_device_memory_limit(kNoMemoryLimit, Device(DeviceType::CPU, d));
            reset_peak_memory_stats(Device(DeviceType::CPU, d));
          }
          distributed::World world{
              .store = r == 0 ? server : std::make_shared<distributed::TCPStore>("127.0.0.1", server->port(), false,
                                                                                 kRankTimeout),
              .rank = r,
              .size = ranks,
              .timeout = kRankTimeout,
              .prefix = "memory_advice"};
          per_rank[static_cast<size_t>(r)] = estimate_memory_of(c, needs_process_group(c) ? &world : nullptr);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    }
  }
  RankEstimates out;
  for (int r = 0; r < ranks; ++r) {
    const std::string& error = errors[static_cast<size_t>(r)];
    if (!error.empty() && (out.error.empty() || (is_timeout(out.error) && !is_timeout(error))))
      out.error = "rank " + std::to_string(r) + ": " + error;
    for (const DeviceMemoryEstimate& e : per_rank[static_cast<size_t>(r)]) out.devices.push_back(e);
  }
  return out;
}

// One alternative's line: its verdict and each rank's predicted peak, or why no estimate came.
std::string estimate_line(const Alternative& alt, int64_t limit, int first_device) {
  const RankEstimates estimates = estimate_in_threads(alt.config, alt.ranks, first_device);
  char head[160];
  if (!estimates.error.empty() || estimates.devices.empty()) {
    std::snprintf(head, sizeof head, "  %-10s %-55s ", "no estimate", alt.flags.c_str());
    std::string why = estimates.error.empty() ? "no device measured" : estimates.error;
    if (const size_t newline = why.find('\n'); newline != std::string::npos) why.resize(newline);
    return head + ("(the estimate failed: " + why + ")");
  }
  std::vector<double> peaks;
  for (const DeviceMemoryEstimate& e : estimates.devices) peaks.push_back(mib(e.peak));
  const double worst = *std::max_element(peaks.begin(), peaks.end());
  const bool fits = limit != kNoMemoryLimit && worst * (1 << 20) <= static_cast<double>(limit);
  std::snprintf(head, sizeof head, "  %-10s %-55s ", limit == kNoMemoryLimit ? "" : fits ? "fits" : "too large",
                alt.flags.c_str());
  std::string text = head + std::string(alt.ranks > 1 ? "rank peaks" : peaks.size() > 1 ? "device peaks" : "peak");
  for (size_t r = 0; r < peaks.size(); ++r) {
    char part[32];
    std::snprintf(part, sizeof part, "%s %.1f", r ? "," : "", peaks[r]);
    text += part;
  }
  return text + " MiB";
}

}  // namespace

std::string memory_advice(const TrainConfig& config, int world) {
  // LOOM_OOM_ADVICE=0: no estimates (a benchmark that runs into the budget on purpose,
  // bench/largest_model.py, wants the error, not a minute of advice after each).
  if (const char* env = std::getenv("LOOM_OOM_ADVICE"); env && std::string(env) == "0")
    return "(LOOM_OOM_ADVICE=0: the alternatives were not estimated)";
  // The alternatives' ranks run on CPU virtual devices, whose kernels, layouts and
  // allocator are not a GPU's: their figures would not be this run's.
  const Device device(config.training.device);
  if (!device.is_cpu())
    return "(no alternatives estimated in the process on " + device.str() + ": its ranks would run on CPU devices; "
           "compare strategies with train_cifar10 --estimate-memory under loomrun on the GPUs)";
  // What every alternative shares: the run's settings, estimated from a fresh start, with
  // nothing written (no checkpoints, weights or metrics) and nothing printed.
  TrainConfig base = config;
  base.checkpoint = CheckpointConfig{};
  base.metrics = MetricsConfig{.json = "", .progress = false};
  base.training.estimate_memory = true;
  base.training.eval_only = false;
  base.training.max_steps = -1;
  base.training.epochs = std::max<int64_t>(base.training.epochs, 1);
  base.parallel.backend = "";  // the CPU's (gloo), whatever the failed run chose
  const int n = std::max(world, 2);
  // An alternative strategy replaces the whole parallel section: its degrees and options.
  const auto strategy = [&](std::string flags, const std::function<void(ParallelConfig&)>& set) {
    Alternative alt{std::move(flags), base, n};
    alt.config.parallel = ParallelConfig{};
    set(alt.config.parallel);
    return alt;
  };
  std::vector<Alternative> alternatives = {
      strategy("--mode ddp", [](ParallelConfig& p) { p.mode = "ddp"; }),
      strategy("--mode ddp --zero-redundancy-optimizer",
               [](ParallelConfig& p) { p.mode = "ddp", p.zero_redundancy_optimizer = true; }),
      strategy("--mode fsdp --sharding-strategy shard_grad_op",
               [](ParallelConfig& p) { p.mode = "fsdp", p.sharding_strategy = "shard_grad_op"; }),
      strategy("--mode fsdp --sharding-strategy full_shard",
               [](ParallelConfig& p) { p.mode = "fsdp", p.sharding_strategy = "full_shard"; }),
      strategy("--pp " + std::to_string(n), [n](ParallelConfig& p) { p.pp = n; }),
  };
  if (config.data.batch_size >= 2) {
    Alternative half{"--batch-size " + std::to_string(config.data.batch_size / 2), base, world};
    half.config.data.batch_size /= 2;
    alternatives.push_back(half);
  }
  const int64_t limit = config.training.device_memory_limit.empty()
                            ? kNoMemoryLimit
                            : parse_memory_size(config.training.device_memory_limit);
  // Past every device the failed run holds: --device and the in-process modes' devices after it.
  const int used = device.index + static_cast<int>(std::max({config.parallel.dp_devices, config.parallel.mp_devices,
                                                             int64_t{2}}));
  const int first_device = std::max(kFirstAdviceDevice, used + 1);
  std::string out = "Predicted peak per rank of the alternatives (shape-only steps of each, in this process, over " +
                    std::to_string(n) + " ranks as threads where it needs them)" +
                    (limit == kNoMemoryLimit ? std::string(":")
                                             : ", against --device-memory-limit " + format_memory_size(limit) + ":");
  for (const Alternative& alt : alternatives) {
    out += '\n';
    out += estimate_line(alt, limit, first_device);
  }
  return out;
}

void throw_with_advice(const OutOfMemoryError& error, const TrainConfig& config) {
  namespace dist = loom::distributed;
  const bool ranks = dist::is_initialized();
  const int rank = ranks ? dist::get_rank() : 0;
  if (ranks && dist::default_store()->add("train_cifar10/oom_advisors", 1) != 1) {
    // Another rank advises; exiting now would make loomrun stop it. It exits when done,
    // and loomrun then stops this rank (or the wait ends).
    std::fprintf(stderr, "train_cifar10: rank %d: out of memory in the first steps; the first rank that failed "
                 "reports which strategies would fit\n", rank);
    std::fflush(stderr);
    try {
      dist::default_store()->wait({"train_cifar10/oom_advice_never_set"}, std::chrono::minutes(5));
    } catch (const std::exception&) {
    }
    throw error;
  }
  std::fprintf(stderr, "train_cifar10: rank %d: out of memory in the first steps; estimating which strategies would "
               "fit (shape-only steps, a few seconds each)...\n", rank);
  std::fflush(stderr);
  const int world = ranks ? dist::get_world_size() : 1;
  std::string advice;
  try {
    advice = memory_advice(config, world);
  } catch (const std::exception& e) {  // the out-of-memory error stays the error
    advice = std::string("(the alternatives could not be estimated: ") + e.what() + ")";
  }
  throw OutOfMemoryError(std::string(error.what()) + "\n" + advice);
}

}  // namespace loom::training
