// Copies between tensors of any dtype, layout and device: the one place that decides
// which backend moves the bytes.
//
// Same device kind: that backend's copy_kernel (strided, converting dtype). CPU virtual
// devices share host memory, so cpu:0 -> cpu:1 is an ordinary CPU copy. Anything that
// touches CUDA goes to the CUDA backend's copy_kernel, which knows host<->device and
// peer transfers (cuda/).
#pragma once

#include "core/tensor.h"

namespace loom {

// dst = src, element for element; shapes must match exactly (no broadcasting here).
void copy_into(Tensor& dst, const Tensor& src, bool non_blocking = false);

}  // namespace loom
