#include "train/conv_benchmark.h"

#include <cstdlib>

#include "core/cpu/kernel_benchmark.h"  // defines: backends::cpu::set_benchmark, set_benchmark_cache
#include "core/error.h"

namespace loom::training {

std::string default_conv_benchmark() {
  const char* value = std::getenv("LOOM_CONV_BENCHMARK");
  if (value == nullptr || *value == '\0') return "on";
  const std::string mode = value;
  LOOM_CHECK(mode == "on" || mode == "off", "LOOM_CONV_BENCHMARK: expected on or off, got '", mode, "'");
  return mode;
}

ConvBenchmarkFlags add_conv_benchmark_flags(Flags& flags) {
  return {&flags.add<std::string>("conv-benchmark", default_conv_benchmark(),
                                  "on: time each convolution algorithm once per shape and keep the fastest "
                                  "(cudnn.benchmark for the CPU); off: fixed rules"),
          &flags.add<std::string>("conv-benchmark-cache", "",
                                  "file of --conv-benchmark choices: read if it exists, rewritten after each search")};
}

void apply_conv_benchmark_flags(const ConvBenchmarkFlags& flags) {
  LOOM_CHECK(*flags.mode == "on" || *flags.mode == "off", "--conv-benchmark: expected on or off, got '", *flags.mode,
             "'");
  LOOM_CHECK(flags.cache->empty() || *flags.mode == "on",
             "--conv-benchmark-cache needs --conv-benchmark on: with it off nothing is searched or read");
  backends::cpu::set_benchmark(*flags.mode == "on");
  backends::cpu::set_benchmark_cache(*flags.cache);
}

}  // namespace loom::training
