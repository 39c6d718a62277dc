#include "train/estimate_memory.h"

#include <unistd.h>  // defines: getpid, readlink (this program's path, for the advice's runs)

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/allocator.h"                // defines: memory_stats (peaks, external bytes, system allocations)
#include "core/atomic_file.h"              // defines: write_file_atomically (--metrics-json)
#include "core/shape_only.h"               // defines: shape_only (Note [Shape-only runs])
#include "nn/json.h"                       // defines: json::parse (the runs' --metrics-json)
#include "train/command_line.h"            // defines: train_flags (the flag table)
#include "parallel/comm/process_group.h"   // defines: is_initialized, default_store, get_rank (who advises)

namespace loom::training {
namespace {

// Past two steps, a few more until the allocator's steady state; a step that still
// allocates from the system after that is measured as it is.
constexpr int64_t kMinSteps = 2;
constexpr int64_t kMaxSteps = 5;

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Bytes of the distinct storages of `tensors` that live on `device` (Note [Counting
// storages, not tensors], nn/model_state.h).
int64_t bytes_on(Device device, const std::vector<Tensor>& tensors) {
  std::set<const StorageImpl*> seen;
  int64_t bytes = 0;
  for (const Tensor& t : tensors)
    if (t.defined() && t.storage() && t.device() == device && seen.insert(t.storage().get()).second)
      bytes += static_cast<int64_t>(t.storage()->nbytes());
  return bytes;
}

int64_t system_allocations(const std::vector<Device>& devices) {
  int64_t n = 0;
  for (Device d : devices) n += memory_stats(d).system_allocations;
  return n;
}

}  // namespace

std::vector<Device> training_devices(Device first, const distributed::ParallelDims& dims) {
  const int count = dims.dp_devices_enabled() ? dims.dp_devices : dims.mp_enabled() ? dims.mp_stages : 1;
  std::vector<Device> devices;
  for (int i = 0; i < count; ++i) devices.emplace_back(first.type, first.index + i);
  return devices;
}

std::vector<DeviceMemoryEstimate> measure_shape_only_steps(const std::vector<Device>& devices,
                                                           const std::function<void()>& step,
                                                           const std::function<bool(bool)>& all_steady,
                                                           const nn::Module& module,
                                                           const optim::Optimizer& optimizer) {
  LOOM_CHECK(shape_only(), "measure_shape_only_steps: turn shape-only runs on first (ShapeOnlyGuard); a real step "
             "would train");
  std::vector<int64_t> held(devices.size()), external_held(devices.size());
  int64_t steps = 0;
  for (;;) {
    for (size_t i = 0; i < devices.size(); ++i) {
      const AllocatorStats s = memory_stats(devices[i]);
      held[i] = s.allocated_bytes;
      external_held[i] = s.external_bytes;
    }
    const int64_t before = system_allocations(devices);
    step();
    ++steps;
    const bool steady = all_steady(system_allocations(devices) == before);
    if (steps >= kMaxSteps || (steps >= kMinSteps && steady)) break;
  }
  std::vector<Tensor> parameters, gradients;
  for (const Tensor& p : module.parameters()) {
    parameters.push_back(p);
    gradients.push_back(p.grad());
  }
  const std::vector<Tensor> state = optimizer.state_tensors();
  std::vector<DeviceMemoryEstimate> out;
  for (size_t i = 0; i < devices.size(); ++i) {
    const AllocatorStats s = memory_stats(devices[i]);
    DeviceMemoryEstimate e;
    e.device = devices[i];
    e.peak = s.peak_allocated_bytes;
    e.parameters = bytes_on(devices[i], parameters);
    e.gradients = bytes_on(devices[i], gradients);
    e.optimizer_state = bytes_on(devices[i], state);
    e.held = held[i];
    e.communication = s.external_bytes_at_peak - external_held[i];
    e.steps = steps;
    out.push_back(e);
  }
  return out;
}

std::string format_estimate(const std::string& where, const DeviceMemoryEstimate& e, int64_t limit) {
  char line[512];
  std::snprintf(line, sizeof line,
                "%s: peak %.1f MiB = model state %.1f (parameters %.1f, gradients %.1f, optimizer state %.1f) "
                "+ other held %.1f + comm %.1f + activations %.1f%s",
                where.c_str(), mib(e.peak), mib(e.model_state()), mib(e.parameters), mib(e.gradients),
                mib(e.optimizer_state), mib(e.other_held()), mib(e.communication), mib(e.activations()),
                limit == kNoMemoryLimit ? "" : e.peak <= limit ? "  fits" : "  DOES NOT FIT");
  return line;
}

void report_memory_estimate(const std::vector<DeviceMemoryEstimate>& mine, const Distributed& dist,
                            const TrainConfig& config) {
  const int64_t limit = config.training.device_memory_limit.empty()
                            ? kNoMemoryLimit
                            : parse_memory_size(config.training.device_memory_limit);
  std::vector<DeviceMemoryEstimate> all = mine;
  std::vector<std::string> where;
  if (dist.enabled()) {  // one device per rank: every rank's, gathered field by field
    LOOM_CHECK(mine.size() == 1, "--estimate-memory: expected one training device per rank, got ", mine.size());
    const DeviceMemoryEstimate& e = mine[0];
    const auto gather = [&](int64_t value) { return dist.all_gather(static_cast<double>(value)); };
    const std::vector<std::vector<double>> fields = {gather(e.peak), gather(e.parameters), gather(e.gradients),
                                                     gather(e.optimizer_state), gather(e.held),
                                                     gather(e.communication), gather(e.steps)};
    all.assign(fields[0].size(), e);
    for (size_t r = 0; r < all.size(); ++r) {
      int64_t* targets[] = {&all[r].peak, &all[r].parameters, &all[r].gradients, &all[r].optimizer_state,
                            &all[r].held, &all[r].communication, &all[r].steps};
      for (size_t f = 0; f < fields.size(); ++f) *targets[f] = static_cast<int64_t>(fields[f][r]);
      where.push_back("rank " + std::to_string(r));
    }
  } else {
    for (const DeviceMemoryEstimate& e : mine) where.push_back(e.device.str());
  }
  if (!dist.is_main()) return;
  int64_t steps = 0, worst = 0;
  for (const DeviceMemoryEstimate& e : all) steps = std::max(steps, e.steps), worst = std::max(worst, e.peak);
  std::printf("memory estimate (%s, shape-only: %lld steps, no arithmetic; max_memory_allocated of a training step, "
              "evaluation not included):\n",
              dist.enabled() ? "per rank" : "per device", static_cast<long long>(steps));
  for (size_t i = 0; i < all.size(); ++i) std::printf("  %s\n", format_estimate(where[i], all[i], limit).c_str());
  // What shape-only steps cannot see (Note [Shape-only runs]): memory kernels allocate
  // for themselves, on the training device.
  const Device first = all.front().device;
  if (first.is_cpu() && first.index == 0)
    std::printf("(on cpu the kernels' own workspace counts too and is not predicted: ResNet18 at batch 32 peaks "
                "3%% higher; train on --device cpu:1 to keep it, and the data, out of the device's figures)\n");
  if (config.training.amp == "fp16" && first.is_cpu())
    std::printf("(--amp fp16 on the CPU: kernels stage float16 through float32 buffers on the device, which "
                "shape-only steps do not allocate: the peak is a lower bound)\n");
  if (limit == kNoMemoryLimit)
    std::printf("no --device-memory-limit given: add one to see whether the peak %.1f MiB fits\n", mib(worst));
  else
    std::printf("--device-memory-limit %s (%s): %s\n", config.training.device_memory_limit.c_str(),
                format_memory_size(limit).c_str(),
                worst <= limit ? "fits"
                               : "does not fit; train_cifar10 without --estimate-memory would stop with an "
                                 "out-of-memory error that lists the strategies that fit");
  std::fflush(stdout);
  if (config.metrics.json.empty()) return;
  json::Value out;
  out.set("estimate", true);
  const auto list = [&](const char* name, const std::function<int64_t(const DeviceMemoryEstimate&)>& value) {
    json::Value::Array mibs;  // per rank (or device), in MiB to 3 decimals
    for (const DeviceMemoryEstimate& e : all) mibs.emplace_back(std::round(mib(value(e)) * 1000) / 1000);
    out.set(name, std::move(mibs));
  };
  list("peak_mib", [](const DeviceMemoryEstimate& e) { return e.peak; });
  list("model_state_mib", [](const DeviceMemoryEstimate& e) { return e.model_state(); });
  list("other_held_mib", [](const DeviceMemoryEstimate& e) { return e.other_held(); });
  list("comm_mib", [](const DeviceMemoryEstimate& e) { return e.communication; });
  list("activations_mib", [](const DeviceMemoryEstimate& e) { return e.activations(); });
  out.set("steps", static_cast<int64_t>(steps));
  write_file_atomically(config.metrics.json, json::dump(out) + "\n", "--metrics-json");
}

// ---- Note [Advice after an out-of-memory error] ------------------------------------------
namespace {

// Flags that say how to run rather than what to estimate (dropped from the advice's runs),
// and flags that choose the strategy (dropped where an alternative sets its own): the flag
// table's parallelism sections.
const std::set<std::string> kRunFlags = {"metrics-json", "save", "checkpoint-dir", "checkpoint-every", "resume",
                                         "max-steps", "epochs", "quiet", "device-memory-limit", "estimate-memory",
                                         "eval-only", "eval-limit"};

struct TableNames {
  std::set<std::string> strategy, switches;  // the parallelism sections' flags; flags without a value
};

// Read off the flag table once (building it builds every model's name list).
const TableNames& table_names() {
  static const TableNames names = [] {
    TableNames out;
    for (const Flags::Info& flag : train_flags()) {
      if (flag.section.rfind("parallelism", 0) == 0) out.strategy.insert(flag.name);
      if (flag.is_switch) out.switches.insert(flag.name);
    }
    return out;
  }();
  return names;
}

// This process's command line after the program, as given.
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
  if (!args.empty()) args.erase(args.begin());
  return args;
}

// `args` without the flags named in `drop` (and their values).
std::vector<std::string> without(const std::vector<std::string>& args, const std::set<std::string>& drop) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i].rfind("--", 0) == 0 ? args[i].substr(2) : "";
    const bool inline_value = name.find('=') != std::string::npos;
    if (inline_value) name = name.substr(0, name.find('='));
    if (!drop.count(name)) {
      out.push_back(args[i]);
      continue;
    }
    if (!inline_value && !table_names().switches.count(name)) ++i;  // its value
  }
  return out;
}

std::string quoted(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string self_path() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  LOOM_CHECK(n > 0, "cannot find this program's path (/proc/self/exe) to run the memory estimates");
  return std::string(path, static_cast<size_t>(n));
}

// loomrun: $LOOMRUN, else beside this program in the build tree, else on the PATH.
std::string loomrun_path(const std::string& self) {
  if (const char* env = std::getenv("LOOMRUN")) return env;
  const auto beside = std::filesystem::path(self).parent_path().parent_path() / "parallel" / "loomrun";
  return std::filesystem::exists(beside) ? beside.string() : "loomrun";
}

// The numbers of "key": [a, b, ...] in a JSON text (--metrics-json's); empty if absent or
// unreadable.
std::vector<double> json_list(const std::string& text, const std::string& key) {
  std::vector<double> out;
  try {
    const json::Value document = json::parse(text);
    if (const json::Value* list = document.find(key); list && list->is_array())
      for (const json::Value& item : list->as_array()) out.push_back(item.as_double());
  } catch (const Error&) {
    out.clear();  // a run that died mid-write: no estimate
  }
  return out;
}

struct Alternative {
  std::string flags;  // what the user would add to the command
  int ranks;
};

// One alternative's line: its verdict and each rank's predicted peak, or why no estimate came.
std::string estimate_line(const Alternative& alt, const std::vector<std::string>& args, const std::string& self,
                          int64_t limit, int index) {
  const std::string stem = "/tmp/loom_estimate_" + std::to_string(::getpid()) + "_" + std::to_string(index);
  std::string command = "env -u RANK -u LOCAL_RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u GROUP_RANK -u MASTER_ADDR "
                        "-u MASTER_PORT -u LOOM_RESTART_COUNT -u TORCHELASTIC_RESTART_COUNT ";
  if (alt.ranks > 1) command += quoted(loomrun_path(self)) + " --standalone --nproc_per_node " + std::to_string(alt.ranks) + " ";
  command += quoted(self);
  for (const std::string& a : args) command += " " + quoted(a);
  command += " " + alt.flags + " --estimate-memory --quiet --metrics-json " + stem + ".json > " + stem + ".log 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream json_file(stem + ".json"), log_file(stem + ".log");
  std::stringstream json, log;
  json << json_file.rdbuf();
  log << log_file.rdbuf();
  std::filesystem::remove(stem + ".json");
  std::filesystem::remove(stem + ".log");
  char head[160];
  const std::vector<double> peaks = json_list(json.str(), "peak_mib");
  if (status != 0 || peaks.empty()) {
    std::string last, line;
    while (std::getline(log, line))
      if (!line.empty()) last = line;
    std::snprintf(head, sizeof head, "  %-10s %-55s ", "no estimate", alt.flags.c_str());
    return head + ("(the estimate failed: " + last + ")");
  }
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

std::string advice(const TrainConfig& config, int world) {
  // LOOM_OOM_ADVICE=0: no estimates (a benchmark that runs into the budget on purpose,
  // bench/largest_model.py, wants the error, not a minute of advice after each).
  if (const char* env = std::getenv("LOOM_OOM_ADVICE"); env && std::string(env) == "0")
    return "(LOOM_OOM_ADVICE=0: the alternatives were not estimated)";
  const std::string self = self_path();
  // The estimates rerun this program with its own flags: only train_cifar10 takes them (a
  // test that calls train_cifar10() would run itself again).
  if (std::filesystem::path(self).filename() != "train_cifar10")
    return "(no alternatives estimated: that takes the train_cifar10 program, and this is " + self +
           "; run train_cifar10 --estimate-memory with the strategies to compare)";
  const std::vector<std::string> args = own_arguments();
  const std::vector<std::string> base = without(args, kRunFlags);
  const std::vector<std::string> plain = without(base, table_names().strategy);
  const int n = std::max(world, 2);
  const std::string ranks = std::to_string(n);
  std::vector<std::pair<Alternative, const std::vector<std::string>*>> runs = {
      {{"--mode ddp", n}, &plain},
      {{"--mode ddp --zero-redundancy-optimizer", n}, &plain},
      {{"--mode fsdp --sharding-strategy shard_grad_op", n}, &plain},
      {{"--mode fsdp --sharding-strategy full_shard", n}, &plain},
      {{"--pp " + ranks, n}, &plain},
  };
  const std::vector<std::string> half = without(base, {"batch-size"});
  if (config.data.batch_size >= 2)
    runs.push_back({{"--batch-size " + std::to_string(config.data.batch_size / 2), world}, &half});
  const int64_t limit = config.training.device_memory_limit.empty()
                            ? kNoMemoryLimit
                            : parse_memory_size(config.training.device_memory_limit);
  std::string out = "Predicted peak per rank of the alternatives (train_cifar10 --estimate-memory under the same "
                    "flags; each with ranks as loomrun --nproc_per_node " + ranks + " where it needs them)" +
                    (limit == kNoMemoryLimit ? std::string(":")
                                             : ", against --device-memory-limit " + format_memory_size(limit) + ":");
  for (size_t i = 0; i < runs.size(); ++i)
    out += "\n" + estimate_line(runs[i].first, *runs[i].second, self, limit, static_cast<int>(i));
  return out;
}

}  // namespace

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
               "fit (train_cifar10 --estimate-memory, a few seconds each)...\n", rank);
  std::fflush(stderr);
  const int world = ranks ? dist::get_world_size() : 1;
  throw OutOfMemoryError(std::string(error.what()) + "\n" + advice(config, world));
}

}  // namespace loom::training
