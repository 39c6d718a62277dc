// CPU conv2d: oneDNN for float32 and bfloat16 (forward, backward-data, backward-weights +
// bias), and
// the direct loops of core/cpu/conv2d_reference.h for float64 (gradient checks).
//
// Each oneDNN call is wrapped by a *plan*: the primitive for one (pass, shape, params,
// layout), the reorders between loom's plain NCHW/OIHW tensors and the layout the
// primitive computes in, and the size of its scratchpad. Plans are built once per shape
// and reused every step (Note [oneDNN plan cache], core/cpu/onednn.h).
//
// Note [Conv2d memory layout]
// loom tensors are plain NCHW. oneDNN's fast convolution kernels want channels blocked
// by the vector width (nChw16c on AVX-512, nChw8c on AVX2), so a plan can (a) compute
// in plain nchw (oneDNN then falls back to im2col + its own sgemm), (b) let oneDNN pick
// (format_tag::any) and reorder tensors in and out around each call, or (c) use nhwc.
// Measured on the ResNet18-CIFAR shapes at batch 128 (bench/bench_ops --layouts), (b)
// wins clearly despite its reorders, so it is the default; LOOM_CONV2D_LAYOUT=nchw|nhwc|
// blocked overrides it (for benchmarks and for bisecting a numerical difference).
// Channels-last tensors (Note [Channels-last activations], core/memory_format.h) are
// handed to oneDNN as nhwc user memory; in bfloat16 the primitive then computes in nhwc
// too, with no reorder at all (at batch 32 the step's reorders went from 54 to 17 ms,
// docs/benchmarks.md), and so does float32 where oneDNN has no AVX-512 (its jit:avx2
// direct kernels take nhwc in all three passes: Note [Channels-last on AVX2],
// core/cpu/activation_layout.h); float32 on AVX-512 keeps the blocked layout its
// Winograd needs. Only the weights are then reordered (OIHW to the kernel's blocked
// layout, and the weight gradient back).
//
// Note [Conv2d algorithm]
// 3x3 convolutions with stride 1 (most of a ResNet's work) run as Winograd F(4x4, 3x3):
// each 6x6 input tile becomes a batch of small matrix multiplies with 4x fewer multiplies
// than the direct convolution (2.25x counting the transforms' share), in all three
// passes. Two implementations:
// - oneDNN's (jit_wino_4x3), which exists only for AVX-512, for every layout. On the
//   ResNet18-CIFAR shapes (bench_ops, one thread, batch 32) forward + backward went from
//   108 / 100 / 119 / 137 ms to 94 / 56 / 44 / 75 ms for 64@32x32 / 128@16x16 / 256@8x8 /
//   512@4x4.
// - loom's own (core/cpu/winograd_conv2d.h) on AVX2 CPUs, where oneDNN has only direct
//   kernels (and under LOOM_CPU_ISA=avx2: Note [CPU ISA switch], core/cpu/cpu_isa.h), for
//   float32 activations with padding 1. It reads and writes loom's NCHW or channels-last
//   tensors as they are (Note [Winograd in channels-last]), so these convolutions need
//   no reorders either.
// LOOM_CONV2D_ALGO chooses (read per call): `auto` (the default) takes Winograd where it
// beats the direct algorithm (loom's own where both channel counts are at least
// kWinogradMinChannels: on AVX2 it beat oneDNN's direct kernels on every ResNet18-CIFAR
// 3x3 shape, by 1.2-2.3x for forward + backward in bench_ops with and without
// LOOM_CONV2D_ALGO=direct; oneDNN's wherever it has it),
// `winograd` wherever the shape allows, `direct` nowhere (for bit-level comparisons and
// benchmarks). The price of Winograd is precision: the tile transforms add rounding, and
// results against a float64 reference are off by ~1e-6 relative instead of ~2e-7 (what
// float32 training on GPUs accepts routinely: cuDNN picks Winograd too, TF32 is at 1e-3);
// tests/test_winograd.cpp bounds it. PyTorch's CPU convolutions are direct.
//
// Note [Conv2d in bfloat16]
// bfloat16 convolutions run on oneDNN's bf16 primitives where the CPU has them (Note
// [bfloat16 on the CPU], core/cpu/bf16_path.h): bf16 activations and weights in the same
// blocked layouts as float32, float32 accumulation, and the direct algorithm -- oneDNN
// has no bf16 Winograd, and on bf16 hardware the direct kernel does twice the work per
// instruction anyway. The weight and bias gradients may be asked for in float32
// (oneDNN's bf16 backward-weights kernels accumulate in float32 and can write it as it
// is): autograd does so under autocast, so that a float32 parameter's gradient is
// never rounded to 16 bits (Note [Autocast conv2d weight gradients], autograd/ops/conv.cpp).
// LOOM_CONV2D_VERBOSE=1 prints each plan's oneDNN implementation as it is built.
//
// Note [Convolutions in batch slices]
// Beside its operands, a oneDNN pass takes memory that grows with the batch: its
// scratchpad, where Winograd holds the whole batch's transformed tiles (36 values per 4x4
// output tile and channel, inputs and outputs alike), and the copies of the activations
// in the layout it computes in (Note [Conv2d memory layout]). On airbench94's 64 ->
// 256-channel 15x15 layer the scratchpad is 734 MiB at batch 1024 and 1.4 GiB at its
// evaluation batch of 2000, more than the layer's output; on its 24 -> 64-channel 31x31
// layer at batch 2000, the blocked copies of input and output are 704 MiB, and the
// forward pass held 1.35 GiB with its operands, the evaluation's peak. So a pass whose
// scratchpad and activation reorders would pass its bound (below) runs on consecutive slices
// of the batch instead, each slice a plan of its own (cached as any other), each slice's
// workspace about the bound (oneDNN's scratchpad keeps 7-9 MB whatever the batch). The
// images are independent, so each slice computes its images' outputs and input gradients,
// and the weight gradient is the sum of the slices' gradients, added in slice order (it
// is sliced only in float32). The numbers are those of one call up to rounding (~2e-6
// relative, tests/test_conv2d.cpp): oneDNN picks its Winograd schedule by the batch it
// is given, and the sums are added in another order; the same command still computes
// the same numbers every run. A slice's reordered inputs are released before the next
// slice, except grad_out's, which backward-data keeps for backward-weights (the unsliced
// passes share it too).
// Slices cost time, though: on airbench94's training step (batch 1024, 2 threads, an
// AVX-512 EPYC) bounding every pass at 256 MiB saved 450 MiB of its 2.8 GiB peak RSS and
// made the step 12% slower (5.4 -> 6.1 s, interleaved runs on a busy machine; 512 MiB:
// 4.5%). So by default only forward passes under no_grad are bounded, at 256 MiB:
// evaluation, whose batches are the largest (airbench94's 2000 against 1024) and hold no
// activations for a backward pass, so that it stays within the memory the training step
// already holds; training computes as without slices. LOOM_CONV2D_MAX_WORKSPACE (read per
// call) bounds every pass instead ("64MiB"), or none ("none"): less memory, slower steps.
#include <dnnl.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <cmath>
#include <omp.h>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <string>
#include <vector>

#include "core/cpu/bf16_path.h"        // defines: bf16_path (Note [bfloat16 on the CPU])
#include "core/cpu/float32_staging.h"  // defines: float32_copy (Note [16-bit CPU kernels stage through float32])
#include "core/cpu/onednn.h"           // defines: PlanCache, cpu_engine, scratchpad (Note [oneDNN plan cache])

#include "core/cpu/contiguous.h"  // defines: contiguous_input (NCHW copies for the direct loops)
#include "core/cpu/conv2d_reference.h"
#include "core/cpu/kernel_benchmark.h"  // defines: autotune::choose, backends::cpu::benchmark (Note [Kernel autotuning])
#include "core/cpu/cpu_isa.h"          // defines: onednn_has_avx512 (Note [CPU ISA switch])
#include "core/cpu/winograd_conv2d.h"  // defines: winograd_forward, winograd_backward_* (loom's own)
#include "core/copy.h"
#include "core/kernels.h"
#include "autograd/grad_mode.h"  // defines: GradMode (Note [Convolutions in batch slices])
#include "core/memory.h"  // defines: parse_memory_size (LOOM_CONV2D_MAX_WORKSPACE)

namespace loom::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Pass : int8_t { Forward, BackwardData, BackwardWeights };
enum class Layout : int8_t { Nchw, Blocked, Nhwc };
enum class Algorithm : int8_t { Direct, Winograd, Auto };

// See Note [Convolutions in batch slices]: the bound on a forward pass under no_grad.
constexpr size_t kMaxWorkspace = 256 << 20;

// The workspace bound of `pass`: LOOM_CONV2D_MAX_WORKSPACE for every pass if set ("none":
// no bound), else kMaxWorkspace for a forward pass under no_grad and none for the rest.
size_t max_workspace(Pass pass) {
  const char* value = std::getenv("LOOM_CONV2D_MAX_WORKSPACE");
  constexpr size_t kNoBound = std::numeric_limits<size_t>::max();
  if (value == nullptr || *value == '\0')
    return pass == Pass::Forward && !GradMode::is_enabled() ? kMaxWorkspace : kNoBound;
  if (std::strcmp(value, "none") == 0) return kNoBound;
  try {
    const int64_t bytes = parse_memory_size(value);
    if (bytes > 0) return static_cast<size_t>(bytes);
  } catch (const Error&) {
  }
  LOOM_FAIL("LOOM_CONV2D_MAX_WORKSPACE: expected a positive memory size such as 64MiB, or 'none', got '", value, "'");
}

// See Note [Conv2d memory layout]: LOOM_CONV2D_LAYOUT if set (read per call, so that
// benchmarks and tests can switch it), else nhwc for channels-last bfloat16 activations
// (computed on as they are) and blocked for everything else.
Layout layout_policy(bool channels_last, DType dtype) {
  const char* value = std::getenv("LOOM_CONV2D_LAYOUT");
  if (value == nullptr || *value == '\0') {
    const bool nhwc_fastest = dtype == kBFloat16 || (dtype == kFloat32 && !onednn_has_avx512());
    return channels_last && nhwc_fastest ? Layout::Nhwc : Layout::Blocked;
  }
  if (std::strcmp(value, "blocked") == 0) return Layout::Blocked;
  if (std::strcmp(value, "nchw") == 0) return Layout::Nchw;
  if (std::strcmp(value, "nhwc") == 0) return Layout::Nhwc;
  LOOM_FAIL("LOOM_CONV2D_LAYOUT: expected 'blocked', 'nchw' or 'nhwc', got '", value, "'");
}

// See Note [Conv2d algorithm].
Algorithm algorithm_from_env() {
  const char* value = std::getenv("LOOM_CONV2D_ALGO");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) return Algorithm::Auto;
  if (std::strcmp(value, "winograd") == 0) return Algorithm::Winograd;
  if (std::strcmp(value, "direct") == 0) return Algorithm::Direct;
  LOOM_FAIL("LOOM_CONV2D_ALGO: expected 'auto', 'winograd' or 'direct', got '", value, "'");
}

// See Note [Conv2d algorithm]: with fewer input or output channels the sgemms are too thin
// (a 3-long sum for the RGB stem) to pay for the transforms, so those stay direct.
constexpr int64_t kWinogradMinChannels = 16;

// Whether loom's own Winograd computes this convolution (Note [Conv2d algorithm]).
bool runs_loom_winograd(const Conv2dGeometry& g, DType dtype) {
  if (dtype != kFloat32 || !winograd_applies(g)) return false;
  const Algorithm algorithm = algorithm_from_env();
  if (algorithm == Algorithm::Direct || onednn_has_avx512()) return false;
  return algorithm == Algorithm::Winograd || (g.c >= kWinogradMinChannels && g.o >= kWinogradMinChannels);
}

using onednn::cpu_engine;

// A plan depends only on this key (Note [oneDNN plan cache]): the pass, the layout and
// algorithm policies, the dtypes, whether a bias (gradient) takes part, and the geometry.
struct PlanKey {
  Pass pass;
  bool channels_last;  // loom's activations are NHWC in memory (else NCHW): Note [Conv2d memory layout]
  Layout layout;       // the layout the primitive computes its activations in
  Algorithm algorithm;
  memory::data_type dtype;       // input, weight, output (and the forward's bias)
  memory::data_type grad_dtype;  // the weight and bias gradients: dtype, or f32 (Note [Conv2d in bfloat16])
  bool with_bias;
  Conv2dGeometry geometry;
  auto operator<=>(const PlanKey&) const = default;
};

// One primitive argument: loom's plain layout, the layout the primitive computes in,
// and the reorder between them when they differ (user->inner for inputs, inner->user
// for outputs).
struct PlanArg {
  int arg;
  bool output;
  memory::desc user;
  memory::desc inner;
  std::optional<dnnl::reorder> reorder;
};

struct Plan {
  dnnl::primitive primitive;
  std::vector<PlanArg> args;
  memory::desc scratchpad;
};

memory::dims dims_of(std::initializer_list<int64_t> values) { return memory::dims(values); }

// The geometry as oneDNN wants it. Note [Conv2d padding]: oneDNN takes an explicit
// right/bottom padding and checks (in + pad_l + pad_r - kernel_extent) / stride + 1 ==
// out with floor division, so PyTorch's symmetric padding is consistent as it is.
struct DnnlGeometry {
  memory::dims src, weights, bias, dst, strides, dilates, padding;
  explicit DnnlGeometry(const Conv2dGeometry& g)
      : src(dims_of({g.n, g.c, g.h, g.w})),
        weights(g.groups == 1 ? dims_of({g.o, g.c, g.kh, g.kw})
                              : dims_of({g.groups, g.o / g.groups, g.c / g.groups, g.kh, g.kw})),
        bias(dims_of({g.o})),
        dst(dims_of({g.n, g.o, g.oh, g.ow})),
        strides(dims_of({g.sh, g.sw})),
        dilates(dims_of({g.dh - 1, g.dw - 1})),  // oneDNN counts the *extra* gap: 0 is dense
        padding(dims_of({g.ph, g.pw})) {}
};

PlanArg plan_arg(int arg, bool output, const memory::desc& user, const memory::desc& inner) {
  PlanArg result{arg, output, user, inner, std::nullopt};
  if (user != inner) {
    const dnnl::engine& engine = cpu_engine();
    result.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(engine, inner, engine, user))
                            : dnnl::reorder(dnnl::reorder::primitive_desc(engine, user, engine, inner));
  }
  return result;
}

// Note [oneDNN's strided 1x1 weight gradient in nhwc]: oneDNN 2.6's jit_1x1 backward-
// weights kernels (avx2 and avx512) gather a strided 1x1 convolution's input into a per-
// thread workspace ("reduce to unit stride") at an offset computed for the blocked layout;
// with an nhwc source and fewer input channels than one channel block (8 on AVX2, 16 on
// AVX-512) the threads write into each other's workspace, and with 2 threads the weight
// gradient comes out wrong at random (relative error 0.05-1.6 on 3->6 channels, stride 2;
// oneDNN issue 6035). Such convolutions are tiny, so their weight gradient is computed in
// the blocked layout instead, which reads the same input correctly.
// tests/test_conv2d.cpp ("a strided 1x1 convolution's weight gradient in nhwc") repeats it.
bool nhwc_miscomputes(const PlanKey& key) {
  const Conv2dGeometry& g = key.geometry;
  constexpr int64_t kWidestChannelBlock = 16;
  return key.pass == Pass::BackwardWeights && g.kh == 1 && g.kw == 1 && (g.sh > 1 || g.sw > 1) &&
         g.c / g.groups < kWidestChannelBlock;
}

std::shared_ptr<const Plan> build_plan_with(const PlanKey& key, dnnl::algorithm algo) {
  const DnnlGeometry d(key.geometry);
  const auto dt = key.dtype;
  const bool grouped = key.geometry.groups > 1;
  const Tag act_tag = key.layout == Layout::Nchw                             ? Tag::nchw
                      : key.layout == Layout::Nhwc && !nhwc_miscomputes(key) ? Tag::nhwc
                                                                             : Tag::any;
  const Tag user_tag = key.channels_last ? Tag::nhwc : Tag::nchw;
  const memory::desc src_user(d.src, dt, user_tag), dst_user(d.dst, dt, user_tag);
  const memory::desc weights_user(d.weights, dt, grouped ? Tag::goihw : Tag::oihw);
  const memory::desc bias_user(d.bias, dt, Tag::x);
  const memory::desc src_any(d.src, dt, act_tag), dst_any(d.dst, dt, act_tag);
  const memory::desc weights_any = key.layout == Layout::Nchw ? weights_user : memory::desc(d.weights, dt, Tag::any);
  const memory::desc no_bias;
  // Backward-weights writes its gradients in grad_dtype.
  const auto gdt = key.grad_dtype;
  const memory::desc grad_weights_user(d.weights, gdt, grouped ? Tag::goihw : Tag::oihw);
  const memory::desc grad_weights_any =
      key.layout == Layout::Nchw ? grad_weights_user : memory::desc(d.weights, gdt, Tag::any);
  const memory::desc grad_bias_user(d.bias, gdt, Tag::x);

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // Note [oneDNN scratchpad]
  const dnnl::engine& engine = cpu_engine();

  // Backward passes are described relative to a forward one (oneDNN's "hint").
  const bool fwd_bias = key.with_bias && key.pass == Pass::Forward;
  dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any, weights_any,
                                      fwd_bias ? bias_user : no_bias, dst_any, d.strides, d.dilates, d.padding,
                                      d.padding),
      attr, engine);

  auto plan = std::make_shared<Plan>();
  switch (key.pass) {
    case Pass::Forward: {
      plan->primitive = dnnl::convolution_forward(fwd);
      plan->args = {plan_arg(DNNL_ARG_SRC, false, src_user, fwd.src_desc()),
                    plan_arg(DNNL_ARG_WEIGHTS, false, weights_user, fwd.weights_desc()),
                    plan_arg(DNNL_ARG_DST, true, dst_user, fwd.dst_desc())};
      if (key.with_bias) plan->args.push_back(plan_arg(DNNL_ARG_BIAS, false, bias_user, fwd.bias_desc()));
      plan->scratchpad = fwd.scratchpad_desc();
      break;
    }
    case Pass::BackwardData: {
      dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(algo, src_any, weights_any, dst_any, d.strides, d.dilates, d.padding,
                                                d.padding),
          attr, engine, fwd);
      plan->primitive = dnnl::convolution_backward_data(pd);
      plan->args = {plan_arg(DNNL_ARG_DIFF_DST, false, dst_user, pd.diff_dst_desc()),
                    plan_arg(DNNL_ARG_WEIGHTS, false, weights_user, pd.weights_desc()),
                    plan_arg(DNNL_ARG_DIFF_SRC, true, src_user, pd.diff_src_desc())};
      plan->scratchpad = pd.scratchpad_desc();
      break;
    }
    case Pass::BackwardWeights: {
      dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(algo, src_any, grad_weights_any,
                                                   key.with_bias ? grad_bias_user : no_bias, dst_any, d.strides, d.dilates, d.padding, d.padding),
          attr, engine, fwd);
      plan->primitive = dnnl::convolution_backward_weights(pd);
      plan->args = {plan_arg(DNNL_ARG_SRC, false, src_user, pd.src_desc()),
                    plan_arg(DNNL_ARG_DIFF_DST, false, dst_user, pd.diff_dst_desc()),
                    plan_arg(DNNL_ARG_DIFF_WEIGHTS, true, grad_weights_user, pd.diff_weights_desc())};
      if (key.with_bias)
        plan->args.push_back(plan_arg(DNNL_ARG_DIFF_BIAS, true, grad_bias_user, pd.diff_bias_desc()));
      plan->scratchpad = pd.scratchpad_desc();
      break;
    }
  }
  return plan;
}

// Note [Conv2d algorithm]: Winograd for float32 3x3 stride-1 convolutions where oneDNN
// implements it for this shape and CPU, the direct algorithm otherwise (and for bf16:
// Note [Conv2d in bfloat16]).
// Algorithm::Winograd (a candidate of Note [Conv2d autotuning]) is strict: where oneDNN has
// no Winograd for the key, building fails and the candidate is left out.
std::shared_ptr<const Plan> build_plan(const PlanKey& key) {
  if (key.algorithm == Algorithm::Winograd) return build_plan_with(key, dnnl::algorithm::convolution_winograd);
  const Conv2dGeometry& g = key.geometry;
  const bool winograd = key.algorithm == Algorithm::Auto && key.dtype == memory::data_type::f32 && g.kh == 3 &&
                        g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1;
  if (winograd) {
    try {
      return build_plan_with(key, dnnl::algorithm::convolution_winograd);
    } catch (const dnnl::error&) {
      // unimplemented here (no AVX-512, a layout it can't use): the direct algorithm
    }
  }
  return build_plan_with(key, dnnl::algorithm::convolution_direct);
}

const char* pass_name(Pass pass) {
  switch (pass) {
    case Pass::Forward: return "forward";
    case Pass::BackwardData: return "backward (input gradient)";
    case Pass::BackwardWeights: return "backward (weight gradient)";
  }
  return "?";
}

const char* dtype_name(memory::data_type dt) {
  return dt == memory::data_type::bf16 ? "bfloat16" : dt == memory::data_type::f16 ? "float16" : "float32";
}

[[noreturn]] void fail_dnnl(const char* file, int line, const char* stage, const PlanKey& key,
                            const dnnl::error& e) {
  onednn::fail(file, line,
               detail::str("conv2d ", pass_name(key.pass), ": oneDNN could not ", stage, " the ", dtype_name(key.dtype),
                           " convolution for ", key.geometry.str()),
               e);
}

// See Note [Conv2d in bfloat16]: which kernel oneDNN picked, for LOOM_CONV2D_VERBOSE=1.
void report_plan(const PlanKey& key, const Plan& plan) {
  static const bool verbose = [] {
    const char* value = std::getenv("LOOM_CONV2D_VERBOSE");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  if (!verbose) return;
  const char* impl = nullptr;
  dnnl_primitive_desc_query(plan.primitive.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl);
  std::fprintf(stderr, "loom conv2d %s %s %s: %s\n", pass_name(key.pass), dtype_name(key.dtype),
               key.geometry.str().c_str(), impl ? impl : "?");
}

// The same for loom's own Winograd, once per pass and shape.
void report_loom_winograd(const char* pass, const Conv2dGeometry& g) {
  static const bool verbose = [] {
    const char* value = std::getenv("LOOM_CONV2D_VERBOSE");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  if (!verbose) return;
  static std::mutex mutex;
  static std::set<std::pair<std::string, Conv2dGeometry>> reported;
  std::lock_guard<std::mutex> lock(mutex);
  if (!reported.insert({pass, g}).second) return;
  std::fprintf(stderr, "loom conv2d %s float32 %s: loom winograd F(%dx%d, 3x3)\n", pass, g.str().c_str(),
               winograd_tile(g), winograd_tile(g));
}

std::shared_ptr<const Plan> get_plan(const PlanKey& key) {
  static onednn::PlanCache<PlanKey, Plan> cache;
  return cache.get(key, [](const PlanKey& k) {
    try {
      std::shared_ptr<const Plan> plan = build_plan(k);
      report_plan(k, *plan);
      return plan;
    } catch (const dnnl::error& e) {
      fail_dnnl(__FILE__, __LINE__, "create", k, e);
    }
  });
}

// Inputs already reordered during this kernel call, so that backward-data and
// backward-weights share the reordered grad_out when both want the same layout.
struct ReorderedInputs {
  struct Entry {
    const void* user_ptr;
    memory::desc inner;
    memory mem;
    Tensor buffer;  // keeps mem's data alive
  };
  std::vector<Entry> entries;
};

// Runs a plan on loom tensors given in the plan's argument order.
void run_plan(const PlanKey& key, const Plan& plan, const std::vector<const Tensor*>& tensors,
              ReorderedInputs& reordered) {
  try {
    const dnnl::engine& engine = cpu_engine();
    dnnl::stream stream(engine);
    std::unordered_map<int, memory> exec_args;
    std::vector<Tensor> buffers;
    std::vector<std::pair<const PlanArg*, std::pair<memory, memory>>> write_back;
    for (size_t i = 0; i < plan.args.size(); ++i) {
      const PlanArg& arg = plan.args[i];
      memory user(arg.user, engine, tensors[i]->raw_data());
      if (!arg.reorder) {
        exec_args.emplace(arg.arg, user);
        continue;
      }
      if (!arg.output) {
        bool found = false;
        for (const auto& entry : reordered.entries) {
          if (entry.user_ptr == user.get_data_handle() && entry.inner == arg.inner) {
            exec_args.emplace(arg.arg, entry.mem);
            found = true;
            break;
          }
        }
        if (found) continue;
      }
      Tensor buffer = onednn::workspace(arg.inner);
      memory inner(arg.inner, engine, buffer.raw_data());
      exec_args.emplace(arg.arg, inner);
      if (arg.output) {
        buffers.push_back(buffer);
        write_back.push_back({&arg, {inner, user}});
      } else {
        arg.reorder->execute(stream, user, inner);
        reordered.entries.push_back({user.get_data_handle(), arg.inner, inner, buffer});
      }
    }
    Tensor scratchpad;  // Note [oneDNN scratchpad]
    if (plan.scratchpad.get_size() > 0) {
      scratchpad = onednn::workspace(plan.scratchpad);
      exec_args.emplace(DNNL_ARG_SCRATCHPAD, memory(plan.scratchpad, engine, scratchpad.raw_data()));
    }
    plan.primitive.execute(stream, exec_args);
    for (auto& [arg, mems] : write_back) arg->reorder->execute(stream, mems.first, mems.second);
    stream.wait();
  } catch (const dnnl::error& e) {
    fail_dnnl(__FILE__, __LINE__, "run", key, e);
  }
}

PlanKey make_key(Pass pass, bool with_bias, const Conv2dGeometry& geometry, DType dtype, bool channels_last,
                 DType grad_dtype = DType::Float32) {
  const memory::data_type dt = onednn::data_type(dtype);
  const memory::data_type gdt = pass == Pass::BackwardWeights ? onednn::data_type(grad_dtype) : dt;
  const Algorithm algorithm = algorithm_from_env() == Algorithm::Direct ? Algorithm::Direct : Algorithm::Auto;
  return PlanKey{pass, channels_last, layout_policy(channels_last, dtype), algorithm, dt, gdt, with_bias, geometry};
}

// The activations' memory format (Note [Channels-last activations], core/memory_format.h):
// the input's, which every other activation tensor of the call must share (the autograd
// op makes them so).
bool activations_channels_last(const char* op, const Tensor& input, std::initializer_list<const Tensor*> others) {
  const MemoryFormat format = input.suggest_memory_format();
  LOOM_CHECK(input.is_contiguous(format), op, ": expected a dense NCHW or channels-last input, got strides ",
             input.strides(), " for shape ", input.shape());
  for (const Tensor* t : others) {
    LOOM_CHECK(!t->defined() || t->is_contiguous(format), op, ": expected every activation tensor in the input's ",
               format, " layout, got strides ", t->strides(), " for shape ", t->shape());
  }
  return format == MemoryFormat::ChannelsLast;
}

// float32 always, bfloat16 where oneDNN has kernels for it (Note [bfloat16 on the CPU]);
// float16, and bfloat16 elsewhere, stage through float32.
bool runs_on_onednn(DType dtype) {
  return dtype == kFloat32 || (dtype == kBFloat16 && bf16_path() != Bf16Path::Staging);
}

// Note [Conv2d in bfloat16]: the weight and bias gradients of a 16-bit convolution may
// be float32; any other dtype mismatch is a caller's bug.
void check_grad_dtype(const char* which, const Tensor& grad, DType dtype) {
  if (!grad.defined()) return;
  LOOM_CHECK(grad.dtype() == dtype || (cpu::is_16bit_float(dtype) && grad.dtype() == kFloat32),
             "conv2d backward: expected a ", dtype, which, " gradient (or float32 for 16-bit inputs), got ",
             grad.dtype());
}

// Note [Conv2d autotuning]
// With loom::backends::cpu::benchmark on (Note [Kernel autotuning], core/cpu/
// kernel_benchmark.h) each pass of each convolution shape runs the fastest of these,
// searched for the first time the shape is met (LOOM_CONV2D_ALGO=winograd|direct or
// LOOM_CONV2D_LAYOUT, when set, decide instead):
// - onednn_winograd_blocked: oneDNN's Winograd (AVX-512 only), channels blocked;
// - onednn_direct_blocked, onednn_direct_nhwc: oneDNN's direct kernels in either layout;
// - loom_winograd: loom's own, on loom's layout as it is (3x3, stride 1, padding 1);
// - float32, for bfloat16 only: the pass in float32 (conversions both ways, then the
//   float32 pass's own choice), where this CPU's bf16 kernels lose to its float32 ones:
//   oneDNN 2.6's bf16 convolutions ran at 0.43x float32 on one Intel Xeon. Autocast
//   trades precision for speed and should never cost speed; each layer that keeps
//   float32 is named once on stderr. (Under autocast the whole layer, casts included,
//   is also timed both ways before it is cast: Note [Autocast precision by
//   measurement], autograd/ops/conv_precision.h.)
// A candidate's reorders between loom's layout (NCHW or channels-last) and the one it
// computes in are part of its timing; so the layout is chosen with the algorithm, per
// pass. Without benchmark the fixed rules of Note [Conv2d algorithm] decide.
constexpr const char* kOnednnWinogradBlocked = "onednn_winograd_blocked";
constexpr const char* kOnednnDirectBlocked = "onednn_direct_blocked";
constexpr const char* kOnednnDirectNhwc = "onednn_direct_nhwc";
constexpr const char* kLoomWinograd = "loom_winograd";
constexpr const char* kFloat32Kernel = "float32";

// The tensors of one pass: forward (x, w, b -> y), input gradient (gy, w -> gx), weight
// gradient (x, gy -> gw, gb). Handles: writing through them writes the caller's tensors.
struct Operands {
  Tensor x, w, b, y, gy, gx, gw, gb;
  DType dtype(Pass pass) const { return pass == Pass::BackwardData ? gy.dtype() : x.dtype(); }
};

void run_pass(Pass pass, const Conv2dGeometry& g, bool channels_last, Operands& t, ReorderedInputs& reordered);

// The bytes a pass takes beside its operands that grow with the batch (Note [Convolutions
// in batch slices]): its scratchpad and its activations' copies in the computing layout
// (an input another pass of the call already reordered is counted again: a bound).
size_t batch_workspace(const Plan& plan) {
  size_t bytes = plan.scratchpad.get_size();
  for (const PlanArg& arg : plan.args) {
    const bool activation = arg.arg == DNNL_ARG_SRC || arg.arg == DNNL_ARG_DST || arg.arg == DNNL_ARG_DIFF_SRC ||
                            arg.arg == DNNL_ARG_DIFF_DST;
    if (activation && arg.reorder) bytes += arg.inner.get_size();
  }
  return bytes;
}

// See Note [Convolutions in batch slices]: into how many slices of the batch of n the pass
// goes, so that each slice's workspace stays under the bound (it grows with the batch);
// 1 for a pass within it, a batch of one, or a weight gradient not in float32.
int64_t batch_slices(Pass pass, const Plan& plan, int64_t n, const Operands& t) {
  const size_t size = batch_workspace(plan), bound = max_workspace(pass);
  if (size <= bound || n < 2) return 1;
  if (pass == Pass::BackwardWeights &&
      (t.gw.dtype() != kFloat32 || (t.gb.defined() && t.gb.dtype() != kFloat32)))
    return 1;
  return std::min<int64_t>(n, static_cast<int64_t>((size + bound - 1) / bound));
}

// a += b, both float32 and contiguous: a slice's weight (or bias) gradient into the sum.
void accumulate(Tensor& a, const Tensor& b) {
  float* out = a.data_ptr<float>();
  const float* in = b.data_ptr<float>();
  const int64_t count = a.numel();
#pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (int64_t i = 0; i < count; ++i) out[i] += in[i];
}

// The pass on `slices` consecutive slices of the batch (Note [Convolutions in batch slices]).
void run_in_batch_slices(Pass pass, const PlanKey& key, int64_t slices, Operands& t, ReorderedInputs& reordered) {
  const int64_t n = key.geometry.n;
  Tensor gw_slice, gb_slice;  // the weight gradient's later slices, added into t.gw and t.gb
  for (int64_t i = 0; i < slices; ++i) {
    const int64_t start = n * i / slices, count = n * (i + 1) / slices - start;
    const size_t kept = reordered.entries.size();
    PlanKey slice_key = key;
    slice_key.geometry.n = count;
    const std::shared_ptr<const Plan> plan = get_plan(slice_key);
    const auto rows = [&](const Tensor& x) { return x.narrow(0, start, count); };
    switch (pass) {
      case Pass::Forward: {
        const Tensor x = rows(t.x), y = rows(t.y);
        run_plan(slice_key, *plan, {&x, &t.w, &y, &t.b}, reordered);
        break;
      }
      case Pass::BackwardData: {
        const Tensor gy = rows(t.gy), gx = rows(t.gx);
        run_plan(slice_key, *plan, {&gy, &t.w, &gx}, reordered);
        break;
      }
      case Pass::BackwardWeights: {
        const Tensor x = rows(t.x), gy = rows(t.gy);
        if (i == 0) {
          run_plan(slice_key, *plan, {&x, &gy, &t.gw, &t.gb}, reordered);
          break;
        }
        if (!gw_slice.defined()) {
          gw_slice = empty(t.gw.shape(), TensorOptions(kFloat32));
          if (t.gb.defined()) gb_slice = empty(t.gb.shape(), TensorOptions(kFloat32));
        }
        run_plan(slice_key, *plan, {&x, &gy, &gw_slice, &gb_slice}, reordered);
        accumulate(t.gw, gw_slice);
        if (t.gb.defined()) accumulate(t.gb, gb_slice);
        break;
      }
    }
    // The slice's reordered inputs go before the next slice's; backward-data leaves its
    // grad_out slices to the weight gradient's slices, which reuse them.
    if (pass != Pass::BackwardData) reordered.entries.erase(reordered.entries.begin() + kept, reordered.entries.end());
  }
}

Tensor float32_in_layout(const Tensor& t, bool channels_last) {
  if (!t.defined()) return Tensor();
  const MemoryFormat format = channels_last && t.dim() == 4 ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  Tensor out = empty(t.shape(), TensorOptions(kFloat32), format);
  copy_into(out, t);
  return out;
}

// One pass with the named algorithm.
void run_pass_with(Pass pass, const std::string& algo, const Conv2dGeometry& g, bool channels_last, Operands& t,
                   ReorderedInputs& reordered) {
  if (algo == kFloat32Kernel) {  // bfloat16 operands, float32 arithmetic and choices
    Operands f;
    for (auto [from, to] : {std::pair{&t.x, &f.x}, {&t.w, &f.w}, {&t.b, &f.b}, {&t.gy, &f.gy}})
      *to = float32_in_layout(*from, channels_last);
    f.y = float32_in_layout(t.y, channels_last);  // outputs: allocated only
    f.gx = float32_in_layout(t.gx, channels_last);
    f.gw = t.gw.defined() && t.gw.dtype() == kFloat32 ? t.gw : float32_in_layout(t.gw, false);
    f.gb = t.gb.defined() && t.gb.dtype() == kFloat32 ? t.gb : float32_in_layout(t.gb, false);
    ReorderedInputs own;
    run_pass(pass, g, channels_last, f, own);
    for (auto [from, to] : {std::pair{&f.y, &t.y}, {&f.gx, &t.gx}, {&f.gw, &t.gw}, {&f.gb, &t.gb}})
      if (to->defined() && !to->is_same(*from)) cpu::round_into(*from, *to);
    return;
  }
  const float* no_bias = nullptr;
  if (algo == kLoomWinograd) {
    switch (pass) {
      case Pass::Forward:
        return winograd_forward(g, t.x.data_ptr<float>(), t.w.data_ptr<float>(),
                                t.b.defined() ? t.b.data_ptr<float>() : no_bias, t.y.data_ptr<float>(), channels_last);
      case Pass::BackwardData:
        return winograd_backward_data(g, t.gy.data_ptr<float>(), t.w.data_ptr<float>(), t.gx.data_ptr<float>(),
                                      channels_last);
      case Pass::BackwardWeights:
        return winograd_backward_weights(g, t.x.data_ptr<float>(), t.gy.data_ptr<float>(), t.gw.data_ptr<float>(),
                                         t.gb.defined() ? t.gb.data_ptr<float>() : nullptr, channels_last);
    }
  }
  const DType dtype = t.dtype(pass);
  PlanKey key = make_key(pass, pass == Pass::Forward ? t.b.defined() : t.gb.defined(), g, dtype, channels_last,
                         pass == Pass::BackwardWeights ? t.gw.dtype() : dtype);
  if (algo != "fixed") {
    key.layout = algo == kOnednnDirectNhwc ? Layout::Nhwc : Layout::Blocked;
    key.algorithm = algo == kOnednnWinogradBlocked ? Algorithm::Winograd : Algorithm::Direct;
  }
  const std::shared_ptr<const Plan> plan = get_plan(key);
  if (const int64_t slices = batch_slices(pass, *plan, g.n, t); slices > 1)
    return run_in_batch_slices(pass, key, slices, t, reordered);
  switch (pass) {
    case Pass::Forward: return run_plan(key, *plan, {&t.x, &t.w, &t.y, &t.b}, reordered);
    case Pass::BackwardData: return run_plan(key, *plan, {&t.gy, &t.w, &t.gx}, reordered);
    case Pass::BackwardWeights: return run_plan(key, *plan, {&t.x, &t.gy, &t.gw, &t.gb}, reordered);
  }
}

Tensor random_float64(const Shape& shape, std::mt19937& rng, double scale) {
  Tensor t = empty(shape, TensorOptions(kFloat64));
  std::normal_distribution<double> normal(0.0, scale);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = normal(rng);
  return t;
}

// max |result - exact| / max |exact|.
double relative_error(const Tensor& result, const Tensor& exact) {
  const Tensor r = result.to(kFloat64).contiguous();
  const double *a = r.data_ptr<double>(), *b = exact.data_ptr<double>();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < exact.numel(); ++i) diff = std::max(diff, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(b[i]));
  return diff / scale;
}

// Note [Kernel autotuning]'s numerics guard: one image of g's shape, in the call's dtypes
// and layout, and the pass's float64 result on the same (rounded) values, computed once
// per search and shared by its candidates. Its own random numbers, so that turning
// benchmark on leaves the global generator's alone.
struct GuardProblem {
  Conv2dGeometry g;
  Operands inputs;             // the candidate's operands, outputs unallocated
  std::vector<Tensor> exact;   // float64, per output of the pass
};

GuardProblem guard_problem(Pass pass, const Conv2dGeometry& geometry, bool channels_last, const Operands& like) {
  GuardProblem p{geometry, {}, {}};
  Conv2dGeometry& g = p.g;
  g.n = 1;
  const DType dtype = like.dtype(pass);
  const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  std::mt19937 rng(20261206);
  // Each operand rounded to its dtype: the float64 copy the reference reads, the one the candidate reads.
  auto operand = [&](const Shape& shape, DType type, double scale, bool activation) {
    Tensor rounded = random_float64(shape, rng, scale).to(type);
    return std::pair{rounded.to(kFloat64).contiguous(), activation ? rounded.contiguous(format) : rounded.contiguous()};
  };
  const Shape in_shape{1, g.c, g.h, g.w}, out_shape{1, g.o, g.oh, g.ow};
  const Shape w_shape = like.w.defined() ? like.w.shape() : like.gw.shape();
  const auto [x64, x] = operand(in_shape, dtype, 1.0, true);
  const auto [w64, w] = operand(w_shape, dtype, 1.0 / std::sqrt(double(g.c / g.groups * g.kh * g.kw)), false);
  const auto [b64, b] = operand({g.o}, dtype, 1.0, false);
  const auto [gy64, gy] = operand(out_shape, dtype, 1.0, true);
  Operands& t = p.inputs;
  switch (pass) {
    case Pass::Forward: {
      t.x = x, t.w = w, t.b = like.b.defined() ? b : Tensor();
      Tensor exact = empty(out_shape, TensorOptions(kFloat64));
      conv2d_reference_forward<double>(g, x64.data_ptr<double>(), w64.data_ptr<double>(),
                                       t.b.defined() ? b64.data_ptr<double>() : nullptr, exact.data_ptr<double>());
      p.exact.push_back(exact);
      break;
    }
    case Pass::BackwardData: {
      t.gy = gy, t.w = w;
      Tensor exact = empty(in_shape, TensorOptions(kFloat64));
      conv2d_reference_backward_data<double>(g, gy64.data_ptr<double>(), w64.data_ptr<double>(), exact.data_ptr<double>());
      p.exact.push_back(exact);
      break;
    }
    case Pass::BackwardWeights: {
      t.x = x, t.gy = gy;
      Tensor exact = empty(w_shape, TensorOptions(kFloat64));
      conv2d_reference_backward_weights<double>(g, gy64.data_ptr<double>(), x64.data_ptr<double>(), exact.data_ptr<double>());
      p.exact.push_back(exact);
      if (like.gb.defined()) {
        Tensor exact_bias = empty({g.o}, TensorOptions(kFloat64));
        conv2d_reference_backward_bias<double>(g, gy64.data_ptr<double>(), exact_bias.data_ptr<double>());
        p.exact.push_back(exact_bias);
      }
      break;
    }
  }
  return p;
}

// The candidate's relative error on the guard's problem: max over the pass's outputs.
double candidate_error(Pass pass, const std::string& algo, bool channels_last, const GuardProblem& p,
                       const Operands& like) {
  const MemoryFormat format = channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  const Conv2dGeometry& g = p.g;
  const DType dtype = like.dtype(pass);
  Operands t = p.inputs;
  std::vector<Tensor> results;
  switch (pass) {
    case Pass::Forward: results.push_back(t.y = empty({1, g.o, g.oh, g.ow}, TensorOptions(dtype), format)); break;
    case Pass::BackwardData: results.push_back(t.gx = empty({1, g.c, g.h, g.w}, TensorOptions(dtype), format)); break;
    case Pass::BackwardWeights:
      results.push_back(t.gw = empty(like.gw.shape(), TensorOptions(like.gw.dtype())));
      if (like.gb.defined()) results.push_back(t.gb = empty({g.o}, TensorOptions(like.gb.dtype())));
      break;
  }
  {
    // A pass nested in the candidate (the float32 candidate's) takes the fixed rules
    // instead of searching one-image shapes of its own.
    backends::cpu::FixedKernelRules fixed;
    ReorderedInputs reordered;
    run_pass_with(pass, algo, g, channels_last, t, reordered);
  }
  double error = 0;
  for (size_t i = 0; i < results.size(); ++i) error = std::max(error, relative_error(results[i], p.exact[i]));
  return error;
}

// Note [Kernel autotuning]'s numerics guard. float32: 2.5x the bound tests/test_winograd.cpp
// holds on its shapes (4e-6, up to 64 channels), because wider layers add rounding: on
// airbench94's 256-channel 7x7 layer, one image, both Winograds measured 3.4-4.2e-6 and
// the direct kernels up to 2.1e-6. A wrong transform entry gives ~0.2 and a bfloat16
// operand ~4e-3, both far outside. bfloat16 keeps 8 bits, so its results are off by up
// to ~2^-8 relative before any algorithm's share.
double error_bound(DType dtype) { return dtype == kFloat32 ? 1e-5 : 1.6e-2; }

// The algorithm the search chose for this pass and shape (searching now if it is new), or
// a replayed cache's choice; nothing where the fixed rules decide: neither searching nor
// replaying, a shape the replayed cache does not list, or forced by the environment.
std::optional<std::string> tuned_algorithm(Pass pass, const Conv2dGeometry& g, bool channels_last, Operands& t) {
  if (!backends::cpu::use_kernel_choices()) return std::nullopt;
  const char* layout_env = std::getenv("LOOM_CONV2D_LAYOUT");
  if (algorithm_from_env() != Algorithm::Auto || (layout_env != nullptr && *layout_env != '\0')) return std::nullopt;
  const DType dtype = t.dtype(pass);
  std::vector<std::string> names;
  const bool winograd_shape = g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1;
  if (dtype == kFloat32 && winograd_shape && onednn_has_avx512()) names.push_back(kOnednnWinogradBlocked);
  names.push_back(kOnednnDirectBlocked);
  names.push_back(kOnednnDirectNhwc);
  if (dtype == kFloat32 && winograd_applies(g)) names.push_back(kLoomWinograd);
  if (dtype == kBFloat16) names.push_back(kFloat32Kernel);
  const DType grad_dtype = pass == Pass::BackwardWeights ? t.gw.dtype() : dtype;
  const std::string what = detail::str("conv2d ", pass_name(pass), " ", dtype_name(onednn::data_type(dtype)),
                                       channels_last ? " channels-last" : "", " ", g.str());
  const bool with_bias = pass == Pass::Forward ? t.b.defined() : t.gb.defined();
  const std::string key = detail::str("conv2d ", pass_name(pass), " ", dtype, " ", grad_dtype, " ",
                                      channels_last ? "nhwc" : "nchw", with_bias ? " bias " : " ", g.str(),
                                      " threads ", omp_get_max_threads());
  if (!backends::cpu::benchmark()) {  // a cache replayed: its choice if it has one this build offers, else the rules
    const std::optional<std::string> known = backends::cpu::kernel_choices().find(key);
    if (!known || std::find(names.begin(), names.end(), *known) == names.end()) return std::nullopt;
    return known;
  }
  std::optional<GuardProblem> problem;  // built by the first candidate's guard, if there is a search
  std::vector<autotune::Candidate> candidates;
  for (const std::string& name : names) {
    candidates.push_back({name,
                          [&, name] {
                            ReorderedInputs own;  // each timed run reorders its own inputs
                            run_pass_with(pass, name, g, channels_last, t, own);
                          },
                          [&, name] {
                            if (!problem) problem = guard_problem(pass, g, channels_last, t);
                            return candidate_error(pass, name, channels_last, *problem, t);
                          }});
  }
  const std::string chosen = autotune::choose(key, what, candidates, error_bound(dtype));
  if (chosen == kFloat32Kernel)
    autotune::tell_once(key, "loom: " + what + " runs in float32 (bfloat16 in and out): on this CPU its float32 "
                             "kernel measured faster than the bfloat16 ones (Note [Conv2d autotuning]).");
  return chosen;
}

// One pass, by the search's choice or the fixed rules (Note [Conv2d algorithm]).
void run_pass(Pass pass, const Conv2dGeometry& g, bool channels_last, Operands& t, ReorderedInputs& reordered) {
  if (std::optional<std::string> algo = tuned_algorithm(pass, g, channels_last, t))
    return run_pass_with(pass, *algo, g, channels_last, t, reordered);
  if (runs_loom_winograd(g, t.dtype(pass))) {
    report_loom_winograd(pass_name(pass), g);
    return run_pass_with(pass, kLoomWinograd, g, channels_last, t, reordered);
  }
  run_pass_with(pass, "fixed", g, channels_last, t, reordered);
}

void conv2d_forward_cpu(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params,
                        Tensor& out) {
  const Conv2dGeometry g(input.shape(), weight.shape(), params);
  if (out.numel() == 0) return;
  const bool channels_last = activations_channels_last("conv2d", input, {&out});
  if (channels_last && !runs_on_onednn(input.dtype())) {  // the direct loops index NCHW
    Tensor out_nchw = empty(out.shape(), TensorOptions(out.dtype()));
    conv2d_forward_cpu(contiguous_input(input), weight, bias, params, out_nchw);
    return copy_into(out, out_nchw);
  }
  if (input.dtype() == kFloat64) {
    return conv2d_reference_forward<double>(g, input.data_ptr<double>(), weight.data_ptr<double>(),
                                            bias.defined() ? bias.data_ptr<double>() : nullptr,
                                            out.data_ptr<double>());
  }
  if (!runs_on_onednn(input.dtype())) {
    LOOM_CHECK(cpu::is_16bit_float(input.dtype()), "conv2d: expected float32, float64, bfloat16 or float16 tensors, got ",
               input.dtype());
    Tensor out32 = cpu::float32_like(out);  // See Note [16-bit CPU kernels stage through float32]
    conv2d_forward_cpu(cpu::float32_copy(input), cpu::float32_copy(weight), cpu::float32_copy(bias), params, out32);
    return cpu::round_into(out32, out);
  }
  Operands t;
  t.x = input, t.w = weight, t.b = bias, t.y = out;
  ReorderedInputs reordered;
  run_pass(Pass::Forward, g, channels_last, t, reordered);
}

void conv2d_backward_cpu(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                         const Conv2dParams& params, Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias) {
  const Conv2dGeometry g(input.shape(), weight.shape(), params);
  check_grad_dtype(" weight", grad_weight, input.dtype());
  check_grad_dtype(" bias", grad_bias, input.dtype());
  if (grad_out.numel() == 0) {  // nothing flowed back: every gradient is zero
    for (Tensor* t : {&grad_input, &grad_weight, &grad_bias})
      if (t->defined()) fill_kernel(DeviceType::CPU)(*t, 0.0);
    return;
  }
  const bool channels_last = activations_channels_last("conv2d backward", input, {&grad_out, &grad_input});
  if (channels_last && !runs_on_onednn(input.dtype())) {  // the direct loops index NCHW
    Tensor gi = grad_input.defined() ? empty(grad_input.shape(), TensorOptions(grad_input.dtype())) : Tensor();
    conv2d_backward_cpu(contiguous_input(grad_out), contiguous_input(input), weight, params, gi, grad_weight,
                        grad_bias);
    if (gi.defined()) copy_into(grad_input, gi);
    return;
  }
  if (input.dtype() == kFloat64) {
    const double* gy = grad_out.data_ptr<double>();
    if (grad_input.defined())
      conv2d_reference_backward_data<double>(g, gy, weight.data_ptr<double>(), grad_input.data_ptr<double>());
    if (grad_weight.defined())
      conv2d_reference_backward_weights<double>(g, gy, input.data_ptr<double>(), grad_weight.data_ptr<double>());
    if (grad_bias.defined()) conv2d_reference_backward_bias<double>(g, gy, grad_bias.data_ptr<double>());
    return;
  }
  if (!runs_on_onednn(input.dtype())) {
    LOOM_CHECK(cpu::is_16bit_float(input.dtype()),
               "conv2d backward: expected float32, float64, bfloat16 or float16 tensors, got ", input.dtype());
    // See Note [16-bit CPU kernels stage through float32]. round_into also writes float32
    // weight/bias gradients as they are.
    Tensor gi = cpu::float32_like(grad_input), gw = cpu::float32_like(grad_weight), gb = cpu::float32_like(grad_bias);
    conv2d_backward_cpu(cpu::float32_copy(grad_out), cpu::float32_copy(input), cpu::float32_copy(weight), params, gi,
                        gw, gb);
    cpu::round_into(gi, grad_input);
    cpu::round_into(gw, grad_weight);
    cpu::round_into(gb, grad_bias);
    return;
  }
  ReorderedInputs reordered;  // grad_out is reordered once for both passes where they share a layout
  if (grad_input.defined()) {
    Operands t;
    t.gy = grad_out, t.w = weight, t.gx = grad_input;
    run_pass(Pass::BackwardData, g, channels_last, t, reordered);
  }
  if (grad_weight.defined() || grad_bias.defined()) {
    // oneDNN computes the bias gradient only together with the weight gradient, and
    // writes both in one dtype.
    const DType grad_dtype = grad_weight.defined() ? grad_weight.dtype() : grad_bias.dtype();
    LOOM_CHECK(!grad_weight.defined() || !grad_bias.defined() || grad_weight.dtype() == grad_bias.dtype(),
               "conv2d backward: expected the weight and bias gradients in one dtype, got ", grad_weight.dtype(),
               " and ", grad_bias.dtype());
    Operands t;
    t.x = input, t.gy = grad_out, t.gb = grad_bias;
    t.gw = grad_weight.defined() ? grad_weight : empty(weight.shape(), TensorOptions(grad_dtype));
    run_pass(Pass::BackwardWeights, g, channels_last, t, reordered);
  }
}

}  // namespace

LOOM_REGISTER_KERNEL(conv2d_forward_kernel, DeviceType::CPU, conv2d_forward_cpu);
LOOM_REGISTER_KERNEL(conv2d_backward_kernel, DeviceType::CPU, conv2d_backward_cpu);

}  // namespace loom::cpu
