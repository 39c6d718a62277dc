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
#include <dnnl.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "core/cpu/cpu_isa.h"          // defines: onednn_has_avx512 (Note [CPU ISA switch])
#include "core/cpu/winograd_conv2d.h"  // defines: winograd_forward, winograd_backward_* (loom's own)
#include "core/copy.h"
#include "core/kernels.h"

namespace loom::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

enum class Pass : int8_t { Forward, BackwardData, BackwardWeights };
enum class Layout : int8_t { Nchw, Blocked, Nhwc };
enum class Algorithm : int8_t { Direct, Winograd, Auto };

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

std::shared_ptr<const Plan> build_plan_with(const PlanKey& key, dnnl::algorithm algo) {
  const DnnlGeometry d(key.geometry);
  const auto dt = key.dtype;
  const bool grouped = key.geometry.groups > 1;
  const Tag act_tag = key.layout == Layout::Nchw ? Tag::nchw : key.layout == Layout::Nhwc ? Tag::nhwc : Tag::any;
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
std::shared_ptr<const Plan> build_plan(const PlanKey& key) {
  const Conv2dGeometry& g = key.geometry;
  const bool winograd = key.algorithm == Algorithm::Winograd && key.dtype == memory::data_type::f32 && g.kh == 3 &&
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

Tensor workspace(const memory::desc& desc) {
  return empty({static_cast<int64_t>(desc.get_size())}, TensorOptions(kUInt8));
}

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
      Tensor buffer = workspace(arg.inner);
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
    if (plan.scratchpad.get_size() > 0) {
      exec_args.emplace(DNNL_ARG_SCRATCHPAD,
                        memory(plan.scratchpad, engine, onednn::scratchpad(plan.scratchpad.get_size(), "conv2d")));
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
  const Algorithm algorithm = algorithm_from_env() == Algorithm::Direct ? Algorithm::Direct : Algorithm::Winograd;
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
  if (runs_loom_winograd(g, input.dtype())) {
    report_loom_winograd("forward", g);
    return winograd_forward(g, input.data_ptr<float>(), weight.data_ptr<float>(),
                            bias.defined() ? bias.data_ptr<float>() : nullptr, out.data_ptr<float>(), channels_last);
  }
  const PlanKey key = make_key(Pass::Forward, bias.defined(), g, input.dtype(), channels_last);
  ReorderedInputs reordered;
  run_plan(key, *get_plan(key), {&input, &weight, &out, &bias}, reordered);
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
  if (runs_loom_winograd(g, input.dtype())) {
    const float* gy = grad_out.data_ptr<float>();
    if (grad_input.defined()) {
      report_loom_winograd("backward (input gradient)", g);
      winograd_backward_data(g, gy, weight.data_ptr<float>(), grad_input.data_ptr<float>(), channels_last);
    }
    if (grad_weight.defined() || grad_bias.defined()) {
      report_loom_winograd("backward (weight gradient)", g);
      Tensor weight_sink = grad_weight.defined() ? grad_weight : empty(weight.shape(), TensorOptions(kFloat32));
      winograd_backward_weights(g, input.data_ptr<float>(), gy, weight_sink.data_ptr<float>(),
                                grad_bias.defined() ? grad_bias.data_ptr<float>() : nullptr, channels_last);
    }
    return;
  }
  ReorderedInputs reordered;  // grad_out is reordered once for both passes
  if (grad_input.defined()) {
    const PlanKey key = make_key(Pass::BackwardData, false, g, input.dtype(), channels_last);
    run_plan(key, *get_plan(key), {&grad_out, &weight, &grad_input}, reordered);
  }
  if (grad_weight.defined() || grad_bias.defined()) {
    // oneDNN computes the bias gradient only together with the weight gradient, and
    // writes both in one dtype.
    const DType grad_dtype = grad_weight.defined() ? grad_weight.dtype() : grad_bias.dtype();
    LOOM_CHECK(!grad_weight.defined() || !grad_bias.defined() || grad_weight.dtype() == grad_bias.dtype(),
               "conv2d backward: expected the weight and bias gradients in one dtype, got ", grad_weight.dtype(),
               " and ", grad_bias.dtype());
    Tensor weight_sink = grad_weight.defined() ? grad_weight : empty(weight.shape(), TensorOptions(grad_dtype));
    const PlanKey key =
        make_key(Pass::BackwardWeights, grad_bias.defined(), g, input.dtype(), channels_last, grad_dtype);
    run_plan(key, *get_plan(key), {&input, &grad_out, &weight_sink, &grad_bias}, reordered);
  }
}

}  // namespace

LOOM_REGISTER_KERNEL(conv2d_forward_kernel, DeviceType::CPU, conv2d_forward_cpu);
LOOM_REGISTER_KERNEL(conv2d_backward_kernel, DeviceType::CPU, conv2d_backward_cpu);

}  // namespace loom::cpu
