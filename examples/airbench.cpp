// airbench: CIFAR-10 to 94% in the least wall time, with the airbench94 recipe
// (examples/speedrun/airbench94.h lists the pieces; docs/speedrun.md the measurements).
//   build/examples/airbench --threads 2                       # one run, seed 0
//   build/examples/airbench --seed 3 --metrics-json run.json  # what bench/time_to_accuracy.py runs
//   build/parallel/loomrun --standalone --nproc_per_node 2 build/examples/airbench --threads 1   # DDP
// Prints the timed total (whitening + training + the final 6-view TTA evaluation) and the
// test accuracy with and without TTA.
#include <omp.h>               // defines: omp_set_num_threads
#include <sys/resource.h>      // defines: getrusage (peak resident memory)

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/atomic_file.h"                  // defines: write_file_atomically
#include "core/cpu/bf16_path.h"                // defines: bf16_autocast_pays
#include "data/data_root.h"                    // defines: find_cifar10_root
#include "examples/speedrun/airbench94.h"      // defines: run_airbench94, load_cifar10_tensors
#include "core/cpu/kernel_benchmark.h"           // defines: backends::cpu::benchmark (reported)
#include "train/conv_benchmark.h"    // defines: --conv-benchmark (Note [Kernel autotuning])
#include "train/flags.h"              // defines: Flags, report_flag_error
#include "train/path_flags.h"         // defines: check_output_file (--metrics-json)
#include "nn/json.h"                           // defines: json::Value, json::dump
#include "parallel/comm/process_group.h"       // defines: init_process_group, default_group

using namespace loom;

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// The phase during which the run's peak RSS was reached: the first whose end saw it (within
// 1 MiB, so that a later phase's few pages more do not claim it).
const examples::Airbench94Memory& peak_phase(const examples::Airbench94Result& r) {
  int64_t peak = 0;
  for (const auto& m : r.memory) peak = std::max(peak, m.peak_resident);
  for (const auto& m : r.memory)
    if (m.peak_resident >= peak - (1 << 20)) return m;
  return r.memory.back();
}

json::Value metrics(const examples::Airbench94Result& r, const examples::Airbench94Config& c, int64_t threads,
                    int64_t processes, int64_t batches_per_epoch) {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  json::Value::Array epochs;
  for (const auto& e : r.per_epoch) {
    json::Value row = json::Value::Object{};
    row.set("epoch", e.epoch);
    row.set("steps", e.steps);
    row.set("train_loss", e.train_loss);
    row.set("elapsed_s", e.elapsed_s);
    if (e.accuracy >= 0) row.set("accuracy", e.accuracy);
    epochs.push_back(row);
  }
  json::Value phases = json::Value::Object{};
  phases.set("whitening", r.whitening_s);
  phases.set("train", r.train_s);
  phases.set("data", r.data_s);
  phases.set("lookahead", r.lookahead_s);
  phases.set("tta", r.tta_s);
  json::Value out = json::Value::Object{};
  out.set("framework", "loom");
  out.set("version", "loom");
  out.set("recipe", "airbench94");
  out.set("seed", static_cast<int64_t>(c.seed));
  out.set("threads", threads);
  out.set("processes", processes);
  out.set("amp", c.bf16 ? "bf16" : "none");
  out.set("conv_benchmark", backends::cpu::benchmark() ? "on" : "off");
  out.set("steps", r.steps);
  out.set("epochs", static_cast<double>(r.steps) / static_cast<double>(batches_per_epoch));
  out.set("tta_accuracy", r.tta_accuracy);
  out.set("accuracy", r.accuracy);
  out.set("wall_time_s", r.wall_time_s);
  out.set("phases_s", phases);
  out.set("train_loss_last", r.train_loss_last);
  out.set("peak_rss_mib", static_cast<double>(usage.ru_maxrss) / 1024.0);
  json::Value::Array memory;  // Note [Where the speedrun's memory goes] (docs/speedrun.md)
  for (const auto& m : r.memory) {
    json::Value row = json::Value::Object{};
    row.set("phase", m.phase);
    row.set("rss_mib", mib(m.resident));
    row.set("peak_rss_mib", mib(m.peak_resident));
    row.set("allocated_mib", mib(m.allocated));
    row.set("reserved_mib", mib(m.reserved));
    row.set("peak_allocated_mib", mib(m.peak_allocated));
    row.set("peak_reserved_mib", mib(m.peak_reserved));
    row.set("system_allocations", m.system_allocations);
    memory.push_back(row);
  }
  out.set("data_mib", mib(r.data_bytes));
  out.set("memory", memory);
  out.set("cpu", cpu_model());
  out.set("per_epoch", epochs);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  training::Flags flags("airbench", "CIFAR-10 to 94% test accuracy with the airbench94 recipe, timed end to end.");
  auto& data_dir = flags.add<std::string>("data", "", "the cifar-10-batches-bin folder (default: $LOOM_DATA, then data/)");
  auto& seed = flags.add<int64_t>("seed", 0, "seed of the initial weights, the order and the augmentation");
  flags.at_least(0, "0 or more");
  auto& threads = flags.add<int64_t>("threads", 0, "compute threads per process (0: OpenMP's default)");
  flags.at_least(0, "0 (OpenMP's default) or more");
  auto& steps = flags.add<int64_t>("max-steps", -1, "stop after N steps (-1: the whole run, 476 steps)");
  flags.at_least(-1, "-1 (the whole run) or 0 or more");
  auto& epochs = flags.add<double>("epochs", 9.9, "length of the run in epochs (the schedules scale with it)");
  flags.above(0, "a positive length in epochs (9.9: the recipe's)");
  auto& amp = flags.add<std::string>("amp", "none", "none, or bf16: CPU autocast (needs AVX-512 bf16)");
  flags.one_of({"none", "bf16"});
  auto& tta = flags.add<int64_t>("tta", 2, "test-time augmentation: 0 none, 1 mirror, 2 mirror + translate");
  flags.in_range(0, 2, "0, 1 or 2");
  auto& eval_every_epoch = flags.add<bool>("eval-every-epoch", false, "untimed test accuracy after each epoch");
  auto& memory_format = flags.add<std::string>("memory-format", "channels_last",
                                                "channels_last (NHWC through the whole net: no reorders) or contiguous");
  flags.one_of({"channels_last", "contiguous"});
  auto& metrics_json = flags.add<std::string>("metrics-json", "", "write the run's figures to this JSON file");
  flags.rule([&] { training::check_output_file("--metrics-json", metrics_json); });
  const training::ConvBenchmarkFlags conv_benchmark = training::add_conv_benchmark_flags(flags);
  std::string root;
  try {
    flags.parse(argc, argv);
    flags.check();
    training::apply_conv_benchmark_flags(conv_benchmark);
    root = data::find_cifar10_root(data_dir.empty() ? std::nullopt : std::optional<std::string>(data_dir));
  } catch (const std::exception& e) {  // the same in every process of a launch: said once
    return training::report_flag_error("airbench", e);
  }
  try {
    if (threads > 0) omp_set_num_threads(static_cast<int>(threads));
    examples::Airbench94Config config;
    const char* world = std::getenv("WORLD_SIZE");
    if (world && std::atoi(world) > 1) {
      distributed::init_process_group("gloo", "env://");
      config.process_group = distributed::default_group();
    }
    const bool rank0 = !config.process_group || config.process_group->rank() == 0;
    config.seed = static_cast<uint64_t>(seed);
    config.max_steps = steps;
    config.epochs = epochs;
    // float32 where the CPU has no bfloat16 arithmetic (Note [bf16 autocast where the CPU has
    // no bfloat16 arithmetic], core/cpu/bf16_path.h), said once.
    config.bf16 = amp == "bf16" && cpu::bf16_autocast_pays();
    if (amp == "bf16" && !config.bf16 && rank0)
      std::printf("--amp bf16: this CPU has no bfloat16 arithmetic (%s), so autocast would only add casts: the run is "
                  "float32 (LOOM_CPU_BF16=staging keeps bfloat16)\n", cpu::bf16_path_description());
    config.tta = static_cast<nn::TTA>(tta);
    config.eval_every_epoch = eval_every_epoch;
    config.memory_format = memory_format == "channels_last" ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    if (rank0) config.log = [](const std::string& line) { std::printf("%s\n", line.c_str()), std::fflush(stdout); };

    const examples::CifarTensors train = examples::load_cifar10_tensors(root, true);
    const examples::CifarTensors test = examples::load_cifar10_tensors(root, false, config.memory_format);
    const examples::Airbench94Result r = examples::run_airbench94(config, train, test);

    if (rank0) {
      std::printf("tta_accuracy %.4f  accuracy %.4f  wall_time %.1f s (whitening %.2f, train %.1f [data %.1f, "
                  "lookahead %.2f], tta %.1f)\n",
                  r.tta_accuracy, r.accuracy, r.wall_time_s, r.whitening_s, r.train_s, r.data_s, r.lookahead_s, r.tta_s);
      const examples::Airbench94Memory& peak = peak_phase(r);
      std::printf("peak RSS %.0f MiB, reached in the %s phase: the data set %.0f MiB; in that phase the caching "
                  "allocator's peak %.0f MiB in tensors, %.0f MiB reserved\n",
                  mib(peak.peak_resident), peak.phase.c_str(), mib(r.data_bytes), mib(peak.peak_allocated),
                  mib(peak.peak_reserved));
      if (!metrics_json.empty()) {
        const int64_t processes = config.process_group ? config.process_group->size() : 1;
        const int64_t per_epoch = train.images.size(0) / config.batch_size;
        write_file_atomically(metrics_json, json::dump(metrics(r, config, threads, processes, per_epoch)) + "\n",
                              "--metrics-json");
      }
    }
    if (config.process_group) distributed::destroy_process_group();
    return 0;
  } catch (const std::exception& e) {  // a filesystem_error or bad_alloc too: one line, never an abort
    std::fprintf(stderr, "airbench: error: %s\n", e.what());
    return 1;
  }
}
