// See core/cpu/activation_layout.h and Note [Channels-last on AVX2].
#include "core/cpu/activation_layout.h"

#include "core/cpu/cpu_isa.h"  // defines: onednn_has_avx512 (Note [CPU ISA switch])

namespace loom::cpu {

MemoryFormat activation_format(DType dtype) {
  if (dtype == kBFloat16) return MemoryFormat::ChannelsLast;
  if (dtype == kFloat32 && !onednn_has_avx512()) return MemoryFormat::ChannelsLast;
  return MemoryFormat::Contiguous;
}

}  // namespace loom::cpu
