// Which way bfloat16 arithmetic runs on this CPU.
//
// Note [bfloat16 on the CPU]
// conv2d, mm and bmm on bfloat16 tensors run through oneDNN's bf16 primitives: bf16
// operands, float32 accumulation, one rounding of the result (as cuBLAS and cuDNN do).
// How fast that is depends on the CPU, and oneDNN decides it at run time:
//   native    AVX512-BF16 or AMX (dnnl::get_effective_cpu_isa() includes
//             avx512_core_bf16): vdpbf16ps does two bf16 products per float32 lane, so
//             a bf16 kernel moves half the bytes and does up to twice the work per
//             instruction of its float32 counterpart.
//   emulated  AVX-512 without BF16: oneDNN widens bf16 to float32 inside its kernels;
//             about float32's speed, but no staging copies.
//   staging   anything older: oneDNN has no bf16 kernels there, and loom copies the
//             operands to float32 instead (Note [16-bit CPU kernels stage through float32]).
// LOOM_CPU_BF16=staging forces the last one everywhere (for benchmarks, and for
// bisecting a numerical difference); float16 always stages.
#pragma once

namespace loom::cpu {

enum class Bf16Path { Native, Emulated, Staging };

// This process's path: the CPU's, or staging under LOOM_CPU_BF16=staging. Read once.
Bf16Path bf16_path();

// "native (oneDNN, AVX512-BF16)", "emulated (oneDNN, AVX-512)" or "float32 staging":
// what the trainer prints once under --amp bf16 on the CPU.
const char* bf16_path_description();

// Note [bf16 autocast where the CPU has no bfloat16 arithmetic]
// On the staging path every bfloat16 kernel converts to float32, computes in float32 and
// converts back, so autocast to bfloat16 adds casts and buys nothing: measured on an
// AVX2-only EPYC, --amp bf16 ran at 0.84x float32 (airbench94) and 0.90x (ResNet18) even
// with each convolution's precision chosen by measurement (bench/results/
// conv_benchmark_avx2.json). Autocast's promise is precision traded for speed, so the
// applications that offer --amp bf16 on the CPU (train_cifar10, airbench, bench_train) run
// float32 there and say so once. LOOM_CPU_BF16=staging, the explicit request for the
// staging path, keeps autocast on (to reproduce bfloat16 numerics on any CPU).
// Whether --amp bf16 on the CPU should run autocast: false on the staging path the CPU
// chose for itself (not under LOOM_CPU_BF16=staging).
bool bf16_autocast_pays();

}  // namespace loom::cpu
