// See core/cpu/bf16_path.h and Note [bfloat16 on the CPU].
#include "core/cpu/bf16_path.h"

#include <dnnl.hpp>  // defines: dnnl::get_effective_cpu_isa, dnnl::cpu_isa

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace loom::cpu {
namespace {

// oneDNN's cpu_isa values are sets of feature bits, not an order (avx2_vnni is
// numerically above avx512_core_bf16), so "at least X" is "has all of X's bits".
bool has_isa(dnnl::cpu_isa effective, dnnl::cpu_isa wanted) {
  const auto e = static_cast<unsigned>(effective), w = static_cast<unsigned>(wanted);
  return (e & w) == w;
}

Bf16Path detect() {
  const char* value = std::getenv("LOOM_CPU_BF16");
  if (value != nullptr && *value != '\0') {
    LOOM_CHECK(std::strcmp(value, "staging") == 0 || std::strcmp(value, "auto") == 0,
               "LOOM_CPU_BF16: expected 'auto' (the CPU's own path) or 'staging' (float32 staging), got '", value,
               "'");
    if (std::strcmp(value, "staging") == 0) return Bf16Path::Staging;
  }
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (has_isa(isa, dnnl::cpu_isa::avx512_core_bf16)) return Bf16Path::Native;  // amx includes these bits
  if (has_isa(isa, dnnl::cpu_isa::avx512_core)) return Bf16Path::Emulated;
  return Bf16Path::Staging;
}

}  // namespace

Bf16Path bf16_path() {
  static const Bf16Path path = detect();
  return path;
}

bool bf16_autocast_pays() {
  if (bf16_path() != Bf16Path::Staging) return true;
  const char* value = std::getenv("LOOM_CPU_BF16");
  return value != nullptr && std::strcmp(value, "staging") == 0;  // asked for by name
}

const char* bf16_path_description() {
  switch (bf16_path()) {
    case Bf16Path::Native:
      return has_isa(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_amx)
                 ? "native bf16 (oneDNN, AMX)"
                 : "native bf16 (oneDNN, AVX512-BF16)";
    case Bf16Path::Emulated: return "emulated bf16 (oneDNN on AVX-512 without BF16)";
    case Bf16Path::Staging: return "float32 staging (Note [16-bit CPU kernels stage through float32])";
  }
  return "?";
}

}  // namespace loom::cpu
