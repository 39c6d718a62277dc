#include "core/memory_format.h"

#include <algorithm>  // defines: std::max

#include "core/error.h"

namespace loom {

const char* memory_format_name(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::Contiguous: return "contiguous_format";
    case MemoryFormat::ChannelsLast: return "channels_last";
    case MemoryFormat::Preserve: return "preserve_format";
  }
  return "?";
}

Shape strides_for(const Shape& shape, MemoryFormat format) {
  LOOM_CHECK(format != MemoryFormat::Preserve, "strides_for: preserve_format has no strides of its own; it means "
             "'the input's format' (empty_like, clone)");
  if (format == MemoryFormat::Contiguous) return contiguous_strides(shape);
  LOOM_CHECK(shape.size() == 4, "channels_last: expected a 4-D tensor [N, C, H, W], got shape ", shape,
             " (channels_last orders the dims of images; use contiguous_format for other tensors)");
  // Memory order N, H, W, C: C varies fastest. A zero-size dim counts as 1, as in PyTorch.
  Shape strides(4);
  int64_t step = 1;
  for (int64_t d : {1, 3, 2, 0}) {
    strides[static_cast<size_t>(d)] = step;
    step = saturating_stride_step(step, shape[static_cast<size_t>(d)]);
  }
  return strides;
}

bool is_contiguous_as(const Shape& shape, const Shape& strides, MemoryFormat format) {
  if (format == MemoryFormat::ChannelsLast && shape.size() != 4) return false;
  const Shape dense = strides_for(shape, format == MemoryFormat::Preserve ? MemoryFormat::Contiguous : format);
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1 && strides[d] != dense[d]) return false;
  return true;
}

MemoryFormat suggest_memory_format(const Shape& shape, const Shape& strides) {
  if (shape.size() == 4 && is_contiguous_as(shape, strides, MemoryFormat::ChannelsLast) &&
      !is_contiguous_as(shape, strides, MemoryFormat::Contiguous))
    return MemoryFormat::ChannelsLast;
  return MemoryFormat::Contiguous;
}

}  // namespace loom
