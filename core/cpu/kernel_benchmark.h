// loom::backends::cpu::benchmark: PyTorch's torch.backends.cudnn.benchmark for loom's CPU
// kernels. The fastest algorithm for a shape is measured, not guessed.
//
//   loom::backends::cpu::set_benchmark(true);              // search once per shape
//   loom::backends::cpu::set_benchmark_cache("conv.txt");  // ... or reuse an earlier run's choices
//
// Note [Kernel autotuning]
// A kernel with several algorithms (conv2d: Note [Conv2d autotuning], core/cpu/conv2d.cpp)
// names each one a *candidate*. With benchmark on, the first call for a key (the op, its
// pass, shapes, strides, dtype, layout and the thread count) runs every candidate on the
// call's own tensors: once to warm up (building its plan), then timed. The fastest
// one is recorded for the key and used from then on, so choices are fixed within a run.
// The timings include whatever the candidate does around its kernel (reorders between
// loom's layout and the kernel's, bf16 <-> float32 conversions), since they are paid
// every step too.
//
// Two guards keep the search from buying speed with a wrong answer:
// - Numerics: before it is timed, each candidate computes the same pass on a one-image
//   problem of the key's shape and is compared with float64; one whose relative error
//   (max |diff| / max |exact|) exceeds the bound is never chosen. The float32 bound is
//   the one loom's Winograd tests hold (4e-6, tests/test_winograd.cpp); a wrong
//   transform entry gives ~0.2.
// - Agreement: with benchmark on, the timings of two data-parallel ranks can pick
//   different algorithms for the same shape, so that replicas round differently.
//   agree_on_kernel_choices (parallel/kernel_choice_agreement.h) hands every rank rank
//   0's table; DDP calls it once, at its second training forward, when every rank has
//   met the shapes of a whole step (as rank 0's pipeline balance is broadcast). A
//   thread world gives each rank thread its own table (ScopedKernelChoices), so this
//   is tested with threads too.
//
// The table can be kept in a file (set_benchmark_cache): it is loaded when set and,
// with benchmark on, rewritten atomically after every search, so a later run on the same
// machine searches nothing. With benchmark off, a cache file is *replayed*: kernels take
// its choices and the fixed rules for any shape it does not list, and nothing is timed,
// so runs that share the file train the same weights (Note [Same command, same model],
// core/deterministic.h). The file names the CPU it was measured on (vendor, family, model
// and the instruction set loom's kernels use), and a file made on another is refused: its
// timings say nothing about this CPU.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace loom::backends::cpu {

// Whether kernels with several algorithms search for the fastest (Note [Kernel
// autotuning]). Off by default, as cudnn.benchmark is, and in every loom program
// (--conv-benchmark on asks for it): a search decided by timings need not pick the same
// algorithms twice, so two runs would differ.
void set_benchmark(bool enabled);
// set_benchmark's setting, unless a FixedKernelRules guard is alive on this thread.
bool benchmark();
// Whether kernels consult the choice table at all: benchmark(), or a cache file set with
// benchmark off (replayed: its choices, never a search), and no FixedKernelRules guard.
bool use_kernel_choices();

// Note [Fixed rules where every rank must count alike]
// While alive, benchmark() is false on this thread: kernels take the fixed rules and no
// search runs. For work whose result must not depend on one rank's clock: the pipeline's
// cost model (parallel/balance.cpp) counts FLOPs and allocated bytes per layer, and a
// search inside it would add its candidates' buffers and its guard's float64 problem to
// the count, and its timings pick per rank which kernel's workspace is counted; the
// ranks then cut the model differently. And the search's own numerics guard, whose
// nested passes must not start searches of their own (Note [Conv2d autotuning]).
class FixedKernelRules {
 public:
  FixedKernelRules();
  ~FixedKernelRules();
  FixedKernelRules(const FixedKernelRules&) = delete;
  FixedKernelRules& operator=(const FixedKernelRules&) = delete;

 private:
  bool previous_;
};

// Loads the choices in `path` if the file exists (a loom::Error if it was written on
// another CPU or is not such a file), and rewrites it after every new search. With
// benchmark off the file must exist: it is replayed, not written. An empty path stops
// reading and writing.
void set_benchmark_cache(const std::string& path);

// What oneDNN and LOOM_CPU_ISA let loom's kernels use here ("avx512_core_bf16",
// "avx2", ...): the part of a key that is the same for the whole process.
std::string cpu_isa_name();
// The CPU a table's timings were measured on: "AuthenticAMD family 25 model 17 (AMD
// EPYC)", from /proc/cpuinfo ("unknown" where it cannot be read).
std::string cpu_identity();

// A table of choices: key -> the chosen candidate's name. Thread-safe.
class KernelChoices {
 public:
  std::optional<std::string> find(const std::string& key) const;
  void set(const std::string& key, const std::string& choice);
  std::map<std::string, std::string> entries() const;
  void clear();

  // "loom kernel choices v2 isa=<isa> cpu=<cpu_identity>" then one "key<TAB>choice" line
  // per entry.
  std::string serialize() const;
  // Sets every entry of a serialize()d text; a loom::Error naming `source` if it is not
  // one, or (unless any_isa) was made on another CPU or instruction set.
  void adopt(const std::string& text, const std::string& source, bool any_isa = false);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::string> choices_;
};

// The table this thread records in: one a ScopedKernelChoices installed, else the process's.
KernelChoices& kernel_choices();

// Installs `table` for this thread for the guard's lifetime (a rank thread of a thread
// world, so that each rank searches and agrees like a process would).
class ScopedKernelChoices {
 public:
  explicit ScopedKernelChoices(KernelChoices& table);
  ~ScopedKernelChoices();
  ScopedKernelChoices(const ScopedKernelChoices&) = delete;
  ScopedKernelChoices& operator=(const ScopedKernelChoices&) = delete;

 private:
  KernelChoices* previous_;
};

}  // namespace loom::backends::cpu

namespace loom::cpu::autotune {

// One way to compute a pass (Note [Kernel autotuning]).
struct Candidate {
  std::string name;
  std::function<void()> run;     // on the call's own tensors
  std::function<double()> error;  // relative error against float64 on a one-image problem
};

// The name of the candidate to use for `key`: the table's choice, or else the fastest
// candidate within `error_bound`, searched for now and recorded. `what` names the call
// in reports and errors ("conv2d forward float32 [...]"). A loom::Error if no candidate
// is within the bound. LOOM_CONV2D_VERBOSE=1 prints each search.
std::string choose(const std::string& key, const std::string& what, const std::vector<Candidate>& candidates,
                   double error_bound);

// Prints `message` on stderr the first time `key` is told in this process, never again:
// how a search says that it kept float32 where 16 bits were asked for.
void tell_once(const std::string& key, const std::string& message);

// Tests only: every timing this thread measures passes through `adjust(candidate, seconds)`
// (a rank whose clock is slowed, to show that agreement overrides it). Empty: none.
void set_timing_adjustment_for_testing(std::function<double(const std::string&, double)> adjust);

}  // namespace loom::cpu::autotune
