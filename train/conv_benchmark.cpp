#include "train/conv_benchmark.h"

#include <cstdlib>

#include "core/cpu/kernel_benchmark.h"  // defines: backends::cpu::set_benchmark, set_benchmark_cache
#include "core/deterministic.h"         // defines: use_deterministic_algorithms (--deterministic)
#include "core/error.h"

namespace loom::training {

std::string default_conv_benchmark() {
  const char* value = std::getenv("LOOM_CONV_BENCHMARK");
  if (value == nullptr || *value == '\0') return "off";
  const std::string mode = value;
  LOOM_CHECK(mode == "on" || mode == "off", "LOOM_CONV_BENCHMARK: expected on or off, got '", mode, "'");
  return mode;
}

ConvBenchmarkFlags add_conv_benchmark_flags(Flags& flags) {
  return {&flags.add<std::string>("conv-benchmark", default_conv_benchmark(),
                                  "on: time each convolution algorithm once per shape and keep the fastest "
                                  "(cudnn.benchmark for the CPU): faster, but two runs may then train different "
                                  "weights, as the timings pick the algorithms; off: fixed rules, the same weights "
                                  "every run (docs/reproducibility.md)"),
          &flags.add<std::string>("conv-benchmark-cache", "",
                                  "file of kernel choices measured on this CPU: with --conv-benchmark on, read if it "
                                  "exists and rewritten after each search; alone, replayed (nothing timed, so runs "
                                  "sharing the file train the same weights)"),
          &flags.add<bool>("deterministic", false,
                           "refuse anything that would make two runs of this command train different weights "
                           "(the kernel search, --balance time): torch.use_deterministic_algorithms(True)")};
}

void apply_conv_benchmark_flags(const ConvBenchmarkFlags& flags) {
  LOOM_CHECK(*flags.mode == "on" || *flags.mode == "off", "--conv-benchmark: expected on or off, got '", *flags.mode,
             "'");
  LOOM_CHECK(!*flags.deterministic || *flags.mode == "off",
             "--deterministic refuses --conv-benchmark on: a kernel search picks algorithms by their timings, which "
             "differ run to run. Drop --conv-benchmark on, or replay an earlier search's choices with "
             "--conv-benchmark-cache FILE alone");
  use_deterministic_algorithms(*flags.deterministic);
  backends::cpu::set_benchmark(*flags.mode == "on");
  backends::cpu::set_benchmark_cache(*flags.cache);
}

}  // namespace loom::training
