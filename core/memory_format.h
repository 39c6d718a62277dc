// MemoryFormat: the order in which a 4-D [N, C, H, W] tensor's elements lie in memory,
// as PyTorch's torch.memory_format.
//
//   Tensor x = images.contiguous(MemoryFormat::ChannelsLast);  // same shape, NHWC in memory
//   x.is_contiguous(MemoryFormat::ChannelsLast);               // true
//   conv(x)  // CPU: the output is channels-last too, and so is every activation after it
//
// Note [Channels-last activations]
// A tensor's shape stays [N, C, H, W] whatever its memory format: only the strides say
// that channels vary fastest, (H*W*C, 1, W*C, C) instead of (C*H*W, H*W, W, 1). Every op
// therefore computes the same values in either format; the format decides speed. It
// matters for bfloat16 convolutions on the CPU: oneDNN computes them in a layout with
// the channels innermost, and a plain NCHW activation is reordered into it and back
// around every call (a fifth of a bfloat16 ResNet18 step, docs/benchmarks.md). With
// channels-last activations the convolutions read and write loom's tensors directly.
//
// The rules are PyTorch's:
// - Ops that make a new tensor shaped like an input keep its format (empty_like,
//   clone, to(dtype), the elementwise ops, relu, batch norm; PyTorch's preserve_format).
//   On the CPU so do conv2d (output and input gradient) and batch norm: a network whose
//   input is channels-last stays channels-last to the pooling at its end. On CUDA they
//   compute in NCHW (cuDNN's NHWC path is not wired up), converting a channels-last
//   input first.
// - contiguous() means NCHW-contiguous; contiguous(MemoryFormat::ChannelsLast) converts
//   the other way. Both are differentiable copies (and no copy at all when the tensor
//   already is in that format).
// - A tensor where the two formats coincide ([N, C, 1, 1], or C == 1) counts as
//   Contiguous: suggest_memory_format says ChannelsLast only when the strides say so
//   and no other reading is possible.
#pragma once

#include <cstdint>
#include <ostream>

#include "core/shape.h"

namespace loom {

enum class MemoryFormat : int8_t {
  Contiguous,    // row-major: NCHW for 4-D tensors (torch.contiguous_format)
  ChannelsLast,  // 4-D only: NHWC in memory, shape still [N, C, H, W] (torch.channels_last)
  Preserve,      // for empty_like / clone: the input's format where it has one (torch.preserve_format)
};

const char* memory_format_name(MemoryFormat format);  // "contiguous_format", "channels_last", ...

// The strides of a dense tensor of `shape` laid out in `format` (Contiguous or
// ChannelsLast; ChannelsLast needs a 4-D shape and says so otherwise).
Shape strides_for(const Shape& shape, MemoryFormat format);

// Whether `strides` lay `shape` out densely in `format`. As Tensor::is_contiguous(),
// a size-1 dimension's stride is ignored.
bool is_contiguous_as(const Shape& shape, const Shape& strides, MemoryFormat format);

// ChannelsLast for a 4-D tensor that is channels-last dense and not also NCHW dense,
// else Contiguous (Note [Channels-last activations]).
MemoryFormat suggest_memory_format(const Shape& shape, const Shape& strides);

}  // namespace loom

namespace std {
inline ostream& operator<<(ostream& out, loom::MemoryFormat format) { return out << loom::memory_format_name(format); }
}  // namespace std
