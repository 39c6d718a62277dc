// loom::backends::cpu::benchmark (Note [Kernel autotuning], core/cpu/kernel_benchmark.h):
// the search keeps the fastest candidate and never a wrong one, the choice table survives
// a file and refuses one from another CPU, convolutions under it stay within float32's
// bound of float64, bfloat16 falls back to float32 where float32 is faster (per pass, and
// under autocast per layer with its casts), and the
// ranks of a DDP thread world end with rank 0's choices even where their clocks disagree.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "autograd/autocast.h"           // defines: autocast::Guard
#include "autograd/ops.h"                // defines: conv2d, randn
#include "core/cpu/bf16_path.h"          // defines: bf16_path (whether bf16 convolutions are native)
#include "core/cpu/kernel_benchmark.h"   // defines: backends::cpu, autotune::choose
#include "core/deterministic.h"        // defines: use_deterministic_algorithms, alert_not_deterministic
#include "core/error.h"
#include "nn/nn.h"                        // defines: nn::Conv2d
#include "parallel/ddp/distributed_data_parallel.h"
#include "parallel/kernel_choice_agreement.h"
#include "rank_threads.h"    // defines: run_ranks
#include "tensor_compare.h"  // defines: relative_error

using namespace loom;
using loom::backends::cpu::KernelChoices;
using loom::backends::cpu::ScopedKernelChoices;
using loom::testing::relative_error;

namespace {

// A candidate that takes `ms` and reports `error`, counting its runs.
cpu::autotune::Candidate sleeper(const std::string& name, int ms, double error, int* runs) {
  return {name,
          [ms, runs] {
            ++*runs;
            std::this_thread::sleep_for(std::chrono::milliseconds(ms));
          },
          [error] { return error; }};
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Turns benchmark on for one scope, and the timing adjustment off after it.
struct BenchmarkOn {
  BenchmarkOn() { backends::cpu::set_benchmark(true); }
  ~BenchmarkOn() {
    backends::cpu::set_benchmark(false);
    cpu::autotune::set_timing_adjustment_for_testing(nullptr);
  }
};

}  // namespace

TEST_CASE("the search keeps the fastest candidate within the bound, never a wrong one, and searches once") {
  KernelChoices table;
  ScopedKernelChoices scope(table);
  int wrong = 0, slow = 0, fast = 0;
  const std::vector<cpu::autotune::Candidate> candidates = {
      sleeper("fast_but_wrong", 1, 0.2, &wrong),  // a transform entry off: fastest, and never chosen
      sleeper("slow", 30, 1e-7, &slow), sleeper("fast", 8, 2e-6, &fast)};
  CHECK(cpu::autotune::choose("k", "test op", candidates, 1e-5) == "fast");
  CHECK(wrong == 0);  // rejected by its error before it was ever timed
  CHECK(table.find("k") == std::optional<std::string>("fast"));
  const int runs = fast + slow;
  CHECK(cpu::autotune::choose("k", "test op", candidates, 1e-5) == "fast");
  CHECK(fast + slow == runs);  // the table answers; nothing runs again

  // NaN errors fail the bound too; with no candidate left the error says why.
  const std::vector<cpu::autotune::Candidate> none = {sleeper("nan", 1, NAN, &wrong), sleeper("far", 1, 0.5, &wrong)};
  try {
    cpu::autotune::choose("k2", "test op", none, 1e-5);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("no algorithm computes this within the error bound") != std::string::npos);
  }
}

TEST_CASE("the choice table round-trips through its file; a file from another CPU or an older loom is refused") {
  const std::string path = (std::filesystem::temp_directory_path() / "loom_test_kernel_choices.txt").string();
  std::filesystem::remove(path);
  KernelChoices& process = backends::cpu::kernel_choices();
  process.clear();
  // With the search off a cache is replayed, so it must exist.
  CHECK_THROWS_WITH_AS(backends::cpu::set_benchmark_cache(path), doctest::Contains("no such file"), Error);
  {
    BenchmarkOn on;
    backends::cpu::set_benchmark_cache(path);
    int runs = 0;
    CHECK(cpu::autotune::choose("conv2d key", "x", {sleeper("a", 1, 0, &runs)}, 1e-5).empty() == false);
  }
  REQUIRE(std::filesystem::exists(path));
  // The file says which CPU measured it.
  CHECK(read_first_line(path).find(backends::cpu::cpu_identity()) != std::string::npos);
  process.clear();
  backends::cpu::set_benchmark_cache(path);  // loads it
  CHECK(process.find("conv2d key") == std::optional<std::string>("a"));
  // A later run that knows the key searches nothing.
  int runs = 0;
  CHECK(cpu::autotune::choose("conv2d key", "x", {sleeper("a", 1, 0, &runs), sleeper("b", 1, 0, &runs)},
                              1e-5) == "a");
  CHECK(runs == 0);

  const std::string here = " cpu=" + backends::cpu::cpu_identity() + "\n";
  for (const std::string& header : {"loom kernel choices v2 isa=some_other_isa" + here,
                                    "loom kernel choices v2 isa=" + backends::cpu::cpu_isa_name() +
                                        " cpu=GenuineIntel family 6 model 143 (Some Xeon)\n"}) {
    {
      std::ofstream other(path);
      other << header << "conv2d k\tonednn_direct_blocked\n";
    }
    try {
      backends::cpu::set_benchmark_cache(path);
      FAIL("expected a refusal");
    } catch (const Error& e) {
      const std::string message = e.what();
      CHECK(message.find(header.find("some_other_isa") != std::string::npos ? "some_other_isa" : "Some Xeon") !=
            std::string::npos);
      CHECK(message.find(backends::cpu::cpu_isa_name()) != std::string::npos);
      CHECK(message.find(backends::cpu::cpu_identity()) != std::string::npos);
    }
  }
  {
    std::ofstream old(path);
    old << "loom kernel choices v1 isa=" << backends::cpu::cpu_isa_name() << "\nconv2d k\tonednn_direct_blocked\n";
  }
  CHECK_THROWS_WITH_AS(backends::cpu::set_benchmark_cache(path), doctest::Contains("did not record the CPU"), Error);
  {
    std::ofstream garbage(path);
    garbage << "not a table\n";
  }
  CHECK_THROWS_WITH_AS(backends::cpu::set_benchmark_cache(path), doctest::Contains("expected a loom kernel choice table"),
                       Error);
  backends::cpu::set_benchmark_cache("");
  process.clear();
  std::filesystem::remove(path);
}

TEST_CASE("a replayed cache decides without timing; under use_deterministic_algorithms a search is refused") {
  const std::string path = (std::filesystem::temp_directory_path() / "loom_test_kernel_replay.txt").string();
  KernelChoices& process = backends::cpu::kernel_choices();
  process.clear();
  Tensor x = randn({2, 16, 8, 8}), w = randn({16, 16, 3, 3}) * 0.1;
  CHECK_FALSE(backends::cpu::use_kernel_choices());
  {
    BenchmarkOn on;
    std::filesystem::remove(path);
    backends::cpu::set_benchmark_cache(path);
    conv2d(x, w, Tensor(), {1}, {1});  // searches the forward, and writes the file
    backends::cpu::set_benchmark_cache("");
  }
  const auto searched = process.entries();
  REQUIRE(searched.size() == 1);
  const std::string key = searched.begin()->first;
  // Replayed: the file's choice (a real candidate's name) decides and nothing is timed or searched.
  process.clear();
  {
    std::ofstream file(path);
    file << "loom kernel choices v2 isa=" << backends::cpu::cpu_isa_name() << " cpu=" << backends::cpu::cpu_identity()
         << "\n" << key << "\tonednn_direct_nhwc\n";
  }
  backends::cpu::set_benchmark_cache(path);
  CHECK(backends::cpu::use_kernel_choices());
  use_deterministic_algorithms(true);  // a replay is deterministic: allowed
  Tensor replayed = conv2d(x, w, Tensor(), {1}, {1});
  CHECK(process.entries().size() == 1);
  Tensor x2 = randn({2, 16, 10, 10});
  conv2d(x2, w, Tensor(), {1}, {1});  // a shape the file lacks: the fixed rules, no search, no refusal
  CHECK(process.entries().size() == 1);
  // With the search on and the switch on, a new shape is refused, naming the way out.
  {
    BenchmarkOn on;
    Tensor x3 = randn({2, 16, 12, 12});
    CHECK_THROWS_WITH_AS(conv2d(x3, w, Tensor(), {1}, {1}), doctest::Contains("--conv-benchmark-cache FILE alone"),
                         Error);
  }
  use_deterministic_algorithms(false);
  CHECK_NOTHROW(alert_not_deterministic("anything"));
  use_deterministic_algorithms(true);
  CHECK_THROWS_WITH_AS(alert_not_deterministic("my op", "do this"), doctest::Contains("my op does not have a deterministic"),
                       Error);
  use_deterministic_algorithms(false);
  backends::cpu::set_benchmark_cache("");
  process.clear();
  std::filesystem::remove(path);
  CHECK(replayed.shape() == Shape{2, 16, 8, 8});
}

TEST_CASE("conv2d with benchmark on: every pass searched, within float32's bound of float64, in both layouts") {
  KernelChoices table;
  ScopedKernelChoices scope(table);
  BenchmarkOn on;
  for (const MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    Tensor x64 = randn({4, 32, 9, 9}, TensorOptions(kFloat64)), w64 = randn({48, 32, 3, 3}, TensorOptions(kFloat64)) * 0.06;
    Tensor b64 = randn({48}, TensorOptions(kFloat64)), g64 = randn({4, 48, 9, 9}, TensorOptions(kFloat64));
    auto run = [&](DType dtype) {
      Tensor x = x64.detach().to(dtype).contiguous(format).requires_grad_(true);
      Tensor w = w64.detach().to(dtype).requires_grad_(true);
      Tensor b = b64.detach().to(dtype).requires_grad_(true);
      Tensor y = conv2d(x, w, b, {1}, {1});
      y.backward(g64.to(dtype).contiguous(format));
      return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad()};
    };
    const size_t before = table.entries().size();
    const std::vector<Tensor> exact = run(kFloat64), tuned = run(kFloat32);
    CHECK(table.entries().size() == before + 3);  // forward, input gradient, weight gradient
    for (size_t i = 0; i < exact.size(); ++i) {
      CAPTURE(i);
      CHECK(relative_error(tuned[i], exact[i]) < 1e-5);
    }
    for (const auto& [key, choice] : table.entries()) std::printf("  %s\n    -> %s\n", key.c_str(), choice.c_str());
  }
}

TEST_CASE("bfloat16 convolutions fall back to float32 where its kernels are faster") {
  if (cpu::bf16_path() == cpu::Bf16Path::Staging) {
    MESSAGE("skipped: bfloat16 convolutions stage through float32 on this CPU anyway");
    return;
  }
  KernelChoices table;
  ScopedKernelChoices scope(table);
  BenchmarkOn on;
  // A CPU whose bf16 kernels are slow: every bf16 candidate's time plus a second, which no
  // preemption of the float32 candidate's timing on a loaded machine can outweigh (a
  // factor could: the kernels take microseconds).
  cpu::autotune::set_timing_adjustment_for_testing(
      [](const std::string& name, double seconds) { return name == "float32" ? seconds : seconds + 1.0; });
  Tensor x = randn({2, 16, 8, 8}).to(kBFloat16), w = (randn({16, 16, 3, 3}) * 0.1).to(kBFloat16);
  Tensor y = conv2d(x, w, Tensor(), {1}, {1});
  int bf16_keys = 0;
  for (const auto& [key, choice] : table.entries()) {
    if (key.find("BFloat16") == std::string::npos && key.find("bfloat16") == std::string::npos) continue;
    ++bf16_keys;
    CHECK(choice == "float32");
  }
  CHECK(bf16_keys == 1);
  // The same numbers as the float32 convolution rounded once to bfloat16.
  Tensor expected = conv2d(x.to(kFloat32), w.to(kFloat32), Tensor(), {1}, {1}).to(kBFloat16);
  CHECK(y.to(kFloat32).tolist<float>() == expected.to(kFloat32).tolist<float>());
}

TEST_CASE("autocast keeps a convolution in float32 where it measured faster, casts included, and casts it where not") {
  // Note [Autocast precision by measurement]: the layer-level choice, on top of the per-pass one.
  Tensor x0 = randn({2, 8, 8, 8}), w0 = randn({8, 8, 3, 3}) * 0.1, b0 = randn({8});
  for (const bool bf16_slow : {true, false}) {
    CAPTURE(bf16_slow);
    KernelChoices table;
    ScopedKernelChoices scope(table);
    BenchmarkOn on;
    // The layer's candidates are named by dtype; slowing "float32" also slows the
    // per-pass float32 fallback of bfloat16 passes, which only keeps them in bfloat16.
    cpu::autotune::set_timing_adjustment_for_testing([bf16_slow](const std::string& name, double seconds) {
      return name == (bf16_slow ? "bfloat16" : "float32") ? seconds + 1.0 : seconds;  // as above: no noise outweighs it
    });
    Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    Tensor y;
    {
      autocast::Guard guard(DeviceType::CPU, kBFloat16);
      y = conv2d(x, w, b, {1}, {1});
    }
    // bfloat16 either way: a layer kept in float32 still returns autocast's dtype, so a
    // residual add with a bfloat16 shortcut after it works (it was an error once).
    CHECK(y.dtype() == kBFloat16);
    int layer_keys = 0;
    for (const auto& [key, choice] : table.entries()) {
      if (key.rfind("autocast ", 0) != 0) continue;
      ++layer_keys;
      CHECK(choice == (bf16_slow ? "float32" : "bfloat16"));
    }
    CHECK(layer_keys == 1);
    y.to(kFloat32).sum().backward();
    CHECK(w.grad().dtype() == kFloat32);
    if (bf16_slow) {  // exactly the float32 layer, then rounded; gradients too (the same table's kernels)
      Tensor xe = x0.clone().requires_grad_(true), we = w0.clone().requires_grad_(true), be = b0.clone().requires_grad_(true);
      Tensor expected = conv2d(xe, we, be, {1}, {1});
      expected.sum().backward();
      CHECK(y.to(kFloat32).tolist<float>() == expected.to(kBFloat16).to(kFloat32).tolist<float>());
      CHECK(x.grad().tolist<float>() == xe.grad().tolist<float>());
      CHECK(w.grad().tolist<float>() == we.grad().tolist<float>());
      CHECK(b.grad().tolist<float>() == be.grad().tolist<float>());
    }
  }
}

TEST_CASE("DDP ranks whose clocks disagree end with rank 0's choices after the second training forward") {
  std::vector<std::shared_ptr<nn::Module>> models;
  for (int r = 0; r < 2; ++r) models.push_back(std::make_shared<nn::Conv2d>(16, 16, 3, 1, 1));
  Tensor images = randn({4, 16, 8, 8});
  std::vector<std::map<std::string, std::string>> after_first(2), after_second(2);
  BenchmarkOn on;
  testing::require_no_errors(testing::run_ranks(2, [&](std::shared_ptr<distributed::Communicator> comm) {
    const int r = comm->rank();
    KernelChoices table;
    ScopedKernelChoices scope(table);
    // Each rank's clock favours another algorithm, as two noisy machines might.
    const std::string favourite = r == 0 ? "onednn_direct_blocked" : "onednn_direct_nhwc";
    cpu::autotune::set_timing_adjustment_for_testing(
        [favourite](const std::string& name, double seconds) { return name == favourite ? seconds / 1000 : seconds; });
    ddp::DistributedDataParallel ddp(models[r], comm);
    ddp(images.narrow(0, 2 * r, 2)).sum().backward();
    after_first[r] = table.entries();
    ddp(images.narrow(0, 2 * r, 2)).sum().backward();  // its forward agrees first
    after_second[r] = table.entries();
    cpu::autotune::set_timing_adjustment_for_testing(nullptr);
  }));
  REQUIRE(after_first[0].size() == 2);  // forward and weight gradient (the images need no gradient)
  for (const auto& [key, choice] : after_first[0]) CHECK(choice == "onednn_direct_blocked");
  for (const auto& [key, choice] : after_first[1]) CHECK(choice == "onednn_direct_nhwc");
  CHECK(after_second[1] == after_second[0]);
  CHECK(after_second[0] == after_first[0]);
}
