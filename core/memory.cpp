#include "core/memory.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace loom {

void set_per_process_memory_fraction(double fraction, Device device) {
  // PyTorch's check and wording ("Invalid fraction value: ... Allowed range: 0~1").
  LOOM_CHECK(fraction >= 0.0 && fraction <= 1.0, "set_per_process_memory_fraction: invalid fraction value: ",
             fraction, ". Allowed range: 0~1 (a share of ", device, "'s ",
             format_memory_size(device_memory_capacity(device)), ")");
  set_device_memory_limit(static_cast<int64_t>(fraction * static_cast<double>(device_memory_capacity(device))), device);
}

void set_device_memory_limit(int64_t bytes, Device device) {
  LOOM_CHECK(bytes >= 0 || bytes == kNoMemoryLimit, "set_device_memory_limit: expected a number of bytes >= 0, or ",
             "kNoMemoryLimit (-1) for none, got ", bytes);
  get_allocator(device.type)->set_memory_limit(device, bytes);
}

int64_t device_memory_limit(Device device) { return get_allocator(device.type)->memory_limit(device); }
int64_t device_memory_capacity(Device device) { return get_allocator(device.type)->capacity(device); }
int64_t device_memory_free(Device device) { return get_allocator(device.type)->free_memory(device); }

int64_t memory_allocated(Device device) { return memory_stats(device).allocated_bytes; }
int64_t max_memory_allocated(Device device) { return memory_stats(device).peak_allocated_bytes; }
int64_t memory_reserved(Device device) { return memory_stats(device).reserved_bytes; }
int64_t max_memory_reserved(Device device) { return memory_stats(device).peak_reserved_bytes; }
void reset_peak_memory_stats(Device device) { get_allocator(device.type)->reset_peak_stats(device); }

std::shared_ptr<void> reserve_external_memory(int64_t bytes, Device device) {
  LOOM_CHECK(bytes >= 0, "reserve_external_memory: expected a number of bytes >= 0, got ", bytes);
  Allocator* allocator = get_allocator(device.type);
  allocator->reserve_external(device, bytes);
  // The handle holds no memory; its deleter gives the bytes back to the device's count.
  return std::shared_ptr<void>(nullptr, [allocator, device, bytes](void*) { allocator->release_external(device, bytes); });
}

ResidentMemory resident_memory() {
  ResidentMemory out;
  std::ifstream status("/proc/self/status");
  std::string key, unit;
  int64_t kib = 0;
  while (status >> key) {
    if (key == "VmRSS:" && status >> kib >> unit) out.current = kib * 1024;
    else if (key == "VmHWM:" && status >> kib >> unit) out.peak = kib * 1024;
    else status.ignore(1 << 16, '\n');
  }
  return out;
}

std::string format_memory_size(int64_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) std::snprintf(text, sizeof text, "%lld bytes", static_cast<long long>(bytes));
  else if (bytes < (1LL << 20)) std::snprintf(text, sizeof text, "%.2f KiB", b / 1024);
  else if (bytes < (1LL << 30)) std::snprintf(text, sizeof text, "%.2f MiB", b / (1 << 20));
  else std::snprintf(text, sizeof text, "%.2f GiB", b / (1 << 30));
  return text;
}

int64_t parse_memory_size(const std::string& text) {
  const auto bad = [&]() {
    return detail::str("expected a memory size such as 1.5GiB, 512MiB, 2GB or a number of bytes, got '", text, "'");
  };
  size_t digits_end = 0;
  double number = 0;
  try {
    number = std::stod(text, &digits_end);
  } catch (const std::exception&) {
    LOOM_FAIL(bad());
  }
  std::string unit = text.substr(digits_end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  double scale = 0;
  for (const auto& [name, factor] : std::initializer_list<std::pair<const char*, double>>{
           {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
           {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}})
    if (unit == name) scale = factor;
  LOOM_CHECK(scale > 0 && std::isfinite(number) && number >= 0, bad());
  return static_cast<int64_t>(std::llround(number * scale));
}

// PyTorch's report (c10/cuda/CUDACachingAllocator.cpp), with loom's names and a last line
// that says what to try here: a smaller batch, or a strategy that holds less per device.
std::string out_of_memory_message(Device device, int64_t requested, const AllocatorStats& stats, int64_t limit) {
  std::ostringstream out;
  out << (device.is_cuda() ? "CUDA" : "CPU") << " out of memory. Tried to allocate " << format_memory_size(requested)
      << ". Device " << device << " has a total capacity of " << format_memory_size(device_memory_capacity(device))
      << " of which " << format_memory_size(device_memory_free(device)) << " is free. ";
  if (limit != kNoMemoryLimit)
    out << format_memory_size(limit) << " allowed (set_per_process_memory_fraction / set_device_memory_limit); ";
  out << "Of the allocated memory " << format_memory_size(stats.allocated_bytes) << " is allocated by loom, and "
      << format_memory_size(stats.reserved_bytes - stats.allocated_bytes)
      << " is reserved by loom but unallocated. Use a smaller batch, or a strategy that holds less per device "
         "(FSDP shards parameters, gradients and optimizer state; a pipeline splits the layers across devices); "
         "memory_summary() shows the device's statistics.";
  return out.str();
}

std::string memory_summary(Device device) {
  const AllocatorStats s = memory_stats(device);
  const int64_t limit = device_memory_limit(device);
  char line[160];
  std::string out;
  const std::string rule(75, '=');
  out += "|" + rule + "|\n";
  std::snprintf(line, sizeof line, "| %-73s |\n", ("loom memory summary, device " + device.str()).c_str());
  out += line;
  std::snprintf(line, sizeof line, "| %-73s |\n",
                ("OOMs: " + std::to_string(s.num_ooms) + "    allocation retries (cache freed): " +
                 std::to_string(s.num_alloc_retries) + "    system allocations: " + std::to_string(s.system_allocations))
                    .c_str());
  out += line;
  std::snprintf(line, sizeof line, "| %-73s |\n",
                ("limit: " + (limit == kNoMemoryLimit ? std::string("none") : format_memory_size(limit)) +
                 "    capacity: " + format_memory_size(device_memory_capacity(device)))
                    .c_str());
  out += line;
  out += "|" + rule + "|\n";
  std::snprintf(line, sizeof line, "| %-33s | %-17s | %-17s |\n", "Metric", "Cur Usage", "Peak Usage");
  out += line;
  out += "|" + std::string(75, '-') + "|\n";
  const auto row = [&](const char* metric, int64_t now, int64_t peak) {
    std::snprintf(line, sizeof line, "| %-33s | %17s | %17s |\n", metric, format_memory_size(now).c_str(),
                  peak < 0 ? "" : format_memory_size(peak).c_str());
    out += line;
  };
  row("Allocated memory", s.allocated_bytes, s.peak_allocated_bytes);
  row("Reserved memory", s.reserved_bytes, s.peak_reserved_bytes);
  row("Reserved but unallocated (cache)", s.reserved_bytes - s.allocated_bytes, -1);
  out += "|" + rule + "|\n";
  return out;
}

}  // namespace loom
