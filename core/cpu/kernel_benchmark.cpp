// The search and the table behind loom::backends::cpu::benchmark (Note [Kernel
// autotuning], kernel_benchmark.h).
#include "core/cpu/kernel_benchmark.h"

#include <dnnl.hpp>  // defines: dnnl::get_effective_cpu_isa

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/atomic_file.h"  // defines: write_file_atomically, read_whole_file
#include "core/cpu/cpu_isa.h"  // defines: cpu_isa_restricted_to_avx2 (Note [CPU ISA switch])
#include "core/deterministic.h"  // defines: alert_not_deterministic (a search under --deterministic)
#include "core/error.h"

namespace loom::backends::cpu {
namespace {

std::atomic<bool> g_benchmark{false};

std::mutex g_cache_mutex;
std::string g_cache_path;  // guarded by g_cache_mutex

KernelChoices& process_table() {
  static KernelChoices table;
  return table;
}
thread_local KernelChoices* t_table = nullptr;  // See ScopedKernelChoices
thread_local bool t_fixed_rules = false;          // See FixedKernelRules

constexpr const char* kHeader = "loom kernel choices v2 isa=";
constexpr const char* kCpuField = " cpu=";
constexpr const char* kAnyVersion = "loom kernel choices v";

}  // namespace

void set_benchmark(bool enabled) { g_benchmark.store(enabled); }
bool benchmark() { return g_benchmark.load() && !t_fixed_rules; }

bool use_kernel_choices() {
  if (t_fixed_rules) return false;
  if (g_benchmark.load()) return true;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  return !g_cache_path.empty();
}

FixedKernelRules::FixedKernelRules() : previous_(t_fixed_rules) { t_fixed_rules = true; }
FixedKernelRules::~FixedKernelRules() { t_fixed_rules = previous_; }

std::string cpu_isa_name() {
  std::string name;
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: name = "sse41"; break;
    case dnnl::cpu_isa::avx: name = "avx"; break;
    case dnnl::cpu_isa::avx2: name = "avx2"; break;
    case dnnl::cpu_isa::avx2_vnni: name = "avx2_vnni"; break;
    case dnnl::cpu_isa::avx512_core: name = "avx512_core"; break;
    case dnnl::cpu_isa::avx512_core_vnni: name = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core_bf16: name = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_amx: name = "avx512_core_amx"; break;
    default: name = "isa" + std::to_string(static_cast<unsigned>(dnnl::get_effective_cpu_isa())); break;
  }
  // loom's own choices follow LOOM_CPU_ISA (Note [CPU ISA switch]), so it is part of the name.
  if (loom::cpu::cpu_isa_restricted_to_avx2()) name += "+loom_avx2";
  return name;
}

std::string cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, vendor, family, model, name;
  // The first processor's block ends at the first empty line; every core of one CPU says the same.
  while (std::getline(in, line) && !line.empty()) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string field = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const size_t start = line.find_first_not_of(' ', colon + 1);
    const std::string value = start == std::string::npos ? "" : line.substr(start);
    if (field == "vendor_id") vendor = value;
    else if (field == "cpu family") family = value;
    else if (field == "model") model = value;
    else if (field == "model name") name = value;
  }
  if (vendor.empty() && name.empty()) return "unknown";
  return vendor + " family " + family + " model " + model + " (" + name + ")";
}

std::optional<std::string> KernelChoices::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = choices_.find(key);
  if (it == choices_.end()) return std::nullopt;
  return it->second;
}

void KernelChoices::set(const std::string& key, const std::string& choice) {
  LOOM_CHECK(key.find_first_of("\t\n") == std::string::npos && choice.find_first_of("\t\n") == std::string::npos,
             "kernel choices: a key or choice may not hold tabs or newlines, got '", key, "' -> '", choice, "'");
  std::lock_guard<std::mutex> lock(mutex_);
  choices_[key] = choice;
}

std::map<std::string, std::string> KernelChoices::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return choices_;
}

void KernelChoices::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  choices_.clear();
}

std::string KernelChoices::serialize() const {
  std::string text = kHeader + cpu_isa_name() + kCpuField + cpu_identity() + "\n";
  for (const auto& [key, choice] : entries()) text += key + "\t" + choice + "\n";
  return text;
}

void KernelChoices::adopt(const std::string& text, const std::string& source, bool any_isa) {
  std::istringstream lines(text);
  std::string line;
  const bool read = static_cast<bool>(std::getline(lines, line));
  LOOM_CHECK(read && line.rfind(kAnyVersion, 0) == 0, source, ": expected a loom kernel choice table (a first line \"",
             kHeader, "...\"), got \"", line.substr(0, 80), "\"");
  LOOM_CHECK(line.rfind(kHeader, 0) == 0 && line.find(kCpuField) != std::string::npos, source,
             ": a kernel choice table from an older loom, which did not record the CPU it was measured on (\"",
             line.substr(0, 80), "\"). Delete the file (or pass another path) to search again.");
  const size_t cpu_at = line.find(kCpuField);
  const std::string isa = line.substr(std::strlen(kHeader), cpu_at - std::strlen(kHeader));
  const std::string cpu = line.substr(cpu_at + std::strlen(kCpuField));
  LOOM_CHECK(any_isa || (isa == cpu_isa_name() && cpu == cpu_identity()), source,
             ": these choices were measured on ", cpu, " running ", isa, " kernels, and this is ", cpu_identity(),
             " running ", cpu_isa_name(), ": their timings say nothing here. Delete the file (or pass another path) to "
             "search again.");
  std::map<std::string, std::string> parsed;
  int number = 1;
  while (std::getline(lines, line)) {
    ++number;
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    LOOM_CHECK(tab != std::string::npos && tab > 0 && tab + 1 < line.size(), source, ":", number,
               ": expected \"key<TAB>choice\", got \"", line, "\"");
    parsed[line.substr(0, tab)] = line.substr(tab + 1);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, choice] : parsed) choices_[key] = std::move(choice);
}

KernelChoices& kernel_choices() { return t_table != nullptr ? *t_table : process_table(); }

ScopedKernelChoices::ScopedKernelChoices(KernelChoices& table) : previous_(t_table) { t_table = &table; }
ScopedKernelChoices::~ScopedKernelChoices() { t_table = previous_; }

void set_benchmark_cache(const std::string& path) {
  LOOM_CHECK(path.empty() || g_benchmark.load() || std::filesystem::exists(path), "kernel choice cache ", path,
             ": no such file. With the search off a cache is replayed, not written; run once with the search on "
             "(--conv-benchmark on --conv-benchmark-cache ", path, ") to make it");
  LOOM_CHECK(path.empty() || !std::filesystem::is_directory(path), "kernel choice cache ", path,
             ": expected a file, got a folder");
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (!path.empty() && std::filesystem::exists(path))
    process_table().adopt(read_whole_file(path, "--conv-benchmark-cache"), path);
  g_cache_path = path;
}

namespace detail {
// After a search: the process's table goes to the cache file (a rank thread's own table
// stays in memory).
void save_cache(const KernelChoices& table) {
  if (&table != &process_table()) return;
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (!g_cache_path.empty()) write_file_atomically(g_cache_path, table.serialize(), "--conv-benchmark-cache");
}
}  // namespace detail

}  // namespace loom::backends::cpu

namespace loom::cpu::autotune {
namespace {

thread_local std::function<double(const std::string&, double)> t_adjust;

bool verbose() {
  static const bool value = [] {
    const char* v = std::getenv("LOOM_CONV2D_VERBOSE");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return value;
}

double seconds_of(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void tell_once(const std::string& key, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> told;
  std::lock_guard<std::mutex> lock(mutex);
  if (told.insert(key).second) std::fprintf(stderr, "%s\n", message.c_str());
}

void set_timing_adjustment_for_testing(std::function<double(const std::string&, double)> adjust) {
  t_adjust = std::move(adjust);
}

std::string choose(const std::string& key, const std::string& what, const std::vector<Candidate>& candidates,
                   double error_bound) {
  backends::cpu::KernelChoices& table = backends::cpu::kernel_choices();
  if (std::optional<std::string> known = table.find(key)) {
    for (const Candidate& c : candidates)
      if (c.name == *known) return *known;
    // A choice this build no longer offers (a cache file from older code): search again.
  }
  // Note [Same command, same model] (core/deterministic.h): timings differ run to run.
  alert_not_deterministic("the CPU kernel search (backends::cpu::benchmark, --conv-benchmark on) for " + what,
                          "replay an earlier search's choices with --conv-benchmark-cache FILE alone, or drop "
                          "--conv-benchmark on");
  std::string best, report;
  double best_seconds = INFINITY;
  for (const Candidate& c : candidates) {
    char line[320];
    double error = NAN, seconds = NAN, warm_seconds = NAN;
    try {
      error = c.error();
      if (error <= error_bound) {  // NaN fails too
        // Note [Kernel autotuning]: one warm-up (plans, workspace), then the fastest of
        // two timed runs. A candidate whose run took 1.8x the best time so far is not
        // timed again: one timed run measured at most ~1.2x the best of two, so it cannot
        // win. (The first run may hold a search of its own, the float32 candidate's.)
        auto timed = [&] { return t_adjust ? t_adjust(c.name, seconds_of(c.run)) : seconds_of(c.run); };
        seconds_of(c.run);
        double warm = timed();
        warm_seconds = warm;
        if (warm > 1.8 * best_seconds) {
          std::snprintf(line, sizeof line, "    %-26s %.2f ms > 1.8x the best: not timed again\n", c.name.c_str(),
                        warm * 1e3);
          report += line;
          continue;
        }
        seconds = std::min(warm, timed());
      }
    } catch (const std::exception& e) {  // not implemented for this shape or CPU
      if (verbose()) report += "    " + c.name + ": unavailable (" + std::string(e.what()).substr(0, 120) + ")\n";
      continue;
    }
    if (std::isnan(seconds)) {
      std::snprintf(line, sizeof line, "    %-26s error %.1e > bound %.1e: never chosen\n", c.name.c_str(), error,
                    error_bound);
    } else {
      std::snprintf(line, sizeof line, "    %-26s %9.2f ms  (first timed run %.2f ms, error %.1e)\n", c.name.c_str(),
                    seconds * 1e3, warm_seconds * 1e3, error);
      if (seconds < best_seconds) best_seconds = seconds, best = c.name;
    }
    report += line;
  }
  if (verbose()) std::fprintf(stderr, "loom benchmark %s:\n%s    -> %s\n", what.c_str(), report.c_str(), best.c_str());
  LOOM_CHECK(!best.empty(), what, ": no algorithm computes this within the error bound ", error_bound,
             " against float64 (or none is implemented for it); the search saw:\n", report,
             "Run with LOOM_CONV2D_VERBOSE=1 for each candidate's reason.");
  table.set(key, best);
  backends::cpu::detail::save_cache(table);
  return best;
}

}  // namespace loom::cpu::autotune
