// --conv-benchmark on|off, --conv-benchmark-cache PATH and --deterministic: the command-line
// face of loom::backends::cpu::benchmark (Note [Kernel autotuning], core/cpu/kernel_benchmark.h)
// and loom::use_deterministic_algorithms (Note [Same command, same model],
// core/deterministic.h), shared by train_cifar10, airbench and the benches.
//
//   ConvBenchmarkFlags conv = add_conv_benchmark_flags(flags);
//   flags.parse(argc, argv);
//   apply_conv_benchmark_flags(conv);
//
// The search is off by default, as cudnn.benchmark is: two runs of one command then train
// the same weights. `--conv-benchmark on` buys speed with that guarantee (the timings, and
// so the algorithms and their rounding, can differ run to run); `--conv-benchmark-cache
// FILE` alone replays a search's choices without timing anything, so runs sharing the file
// agree. $LOOM_CONV_BENCHMARK=on|off sets the flag's default for a shell.
#pragma once

#include <string>

#include "train/flags.h"  // defines: Flags

namespace loom::training {

struct ConvBenchmarkFlags {
  std::string* mode;         // "on" | "off"
  std::string* cache;        // "" or a file of choices
  bool* deterministic;       // --deterministic
};

ConvBenchmarkFlags add_conv_benchmark_flags(Flags& flags);

// Checks the values (a loom::Error saying what was expected) and sets them.
void apply_conv_benchmark_flags(const ConvBenchmarkFlags& flags);

// The default of --conv-benchmark: $LOOM_CONV_BENCHMARK (on|off), else off.
std::string default_conv_benchmark();

}  // namespace loom::training
