#include "parallel/launcher/cpu_binding.h"

#include <sched.h>

#include "core/error.h"
#include "parallel/system_error.h"  // defines: LOOM_CHECK_ERRNO

namespace loom::launcher {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  LOOM_CHECK_ERRNO(::sched_getaffinity(0, sizeof(set), &set) == 0, "sched_getaffinity() for loomrun's CPUs");
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<std::vector<int>> exclusive_cpu_sets(const std::vector<int>& cpus, int workers) {
  LOOM_CHECK(workers >= 1, "exclusive_cpu_sets: expected at least one worker, got ", workers);
  LOOM_CHECK(static_cast<int>(cpus.size()) >= workers, "loomrun: --numa-binding exclusive gives each worker its own "
             "CPUs, but ", workers, " workers were asked for and loomrun may run on only ", cpus.size(), " (",
             cpu_list_string(cpus), "). Use fewer workers per node, or drop --numa-binding");
  std::vector<std::vector<int>> sets(static_cast<size_t>(workers));
  const size_t n = cpus.size(), w = static_cast<size_t>(workers);
  for (size_t i = 0; i < w; ++i)
    sets[i].assign(cpus.begin() + static_cast<long>(i * n / w), cpus.begin() + static_cast<long>((i + 1) * n / w));
  return sets;
}

std::string cpu_list_string(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace loom::launcher
