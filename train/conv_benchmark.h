// --conv-benchmark on|off and --conv-benchmark-cache PATH: the command-line face of
// loom::backends::cpu::benchmark (Note [Kernel autotuning], core/cpu/kernel_benchmark.h),
// shared by train_cifar10, airbench and the benches.
//
//   ConvBenchmarkFlags conv = add_conv_benchmark_flags(flags);
//   flags.parse(argc, argv);
//   apply_conv_benchmark_flags(conv);
//
// The default is on, unless $LOOM_CONV_BENCHMARK says off: the test suite sets that,
// because tests that compare two runs bit for bit need both to run the same algorithms,
// and a search decided by timings need not pick the same ones twice.
#pragma once

#include <string>

#include "train/flags.h"  // defines: Flags

namespace loom::training {

struct ConvBenchmarkFlags {
  std::string* mode;   // "on" | "off"
  std::string* cache;  // "" or a file of choices
};

ConvBenchmarkFlags add_conv_benchmark_flags(Flags& flags);

// Checks the values (a loom::Error saying what was expected) and sets them.
void apply_conv_benchmark_flags(const ConvBenchmarkFlags& flags);

// The default of --conv-benchmark: $LOOM_CONV_BENCHMARK (on|off), else on.
std::string default_conv_benchmark();

}  // namespace loom::training
