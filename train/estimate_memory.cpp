#include "train/estimate_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/allocator.h"                // defines: memory_stats (peaks, external bytes, system allocations)
#include "core/atomic_file.h"              // defines: write_file_atomically (--metrics-json)
#include "core/memory.h"                   // defines: kNoMemoryLimit, parse_memory_size, format_memory_size
#include "nn/json.h"                       // defines: json::Value (--metrics-json)
#include "core/shape_only.h"               // defines: shape_only (Note [Shape-only runs])

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

}  // namespace loom::training
