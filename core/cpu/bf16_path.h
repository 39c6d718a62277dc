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

}  // namespace loom::cpu
