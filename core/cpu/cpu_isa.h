// Which x86 vector instructions loom's own CPU kernels may use, and the switch that
// restricts them for measurement.
//
// Note [CPU ISA switch]
// libloom is built for x86-64-v3 (AVX2 + FMA, meson.build), and oneDNN and OpenBLAS pick
// their kernels at run time. So an AVX-512 machine behaves differently from an AVX2-only
// one in two places: oneDNN has Winograd convolutions only for AVX-512 (loom uses its own,
// core/cpu/winograd_conv2d.h, where oneDNN has none: Note [Conv2d algorithm]), and the
// libraries' kernels are wider. To measure on an AVX-512 machine what an AVX2 CPU does,
// restrict all three in one run:
//
//   LOOM_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell build/bench/bench_train
//
// LOOM_CPU_ISA=avx2 makes loom's own choices as on an AVX2 CPU (read on every call, so
// tests can switch it); the other two are read once by their libraries at start-up
// (ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 do the same for PyTorch).
#pragma once

#include <dnnl.hpp>  // defines: dnnl::get_effective_cpu_isa

#include <cstdlib>
#include <cstring>

#include "core/error.h"  // defines: LOOM_FAIL

namespace loom::cpu {

// See Note [CPU ISA switch]: true under LOOM_CPU_ISA=avx2.
inline bool cpu_isa_restricted_to_avx2() {
  const char* value = std::getenv("LOOM_CPU_ISA");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "native") == 0) return false;
  if (std::strcmp(value, "avx2") == 0) return true;
  LOOM_FAIL("LOOM_CPU_ISA: expected 'avx2' or 'native', got '", value, "'");
}

// Whether oneDNN runs its AVX-512 kernels here (its Winograd convolutions among them),
// after ONEDNN_MAX_CPU_ISA and LOOM_CPU_ISA.
inline bool onednn_has_avx512() {
  static const bool avx512 = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  }();
  // The variable is read even where there is no AVX-512 to turn off, so that a misspelt
  // value is an error on every CPU, not only on the ones where it would matter.
  const bool restricted = cpu_isa_restricted_to_avx2();
  return avx512 && !restricted;
}

}  // namespace loom::cpu
