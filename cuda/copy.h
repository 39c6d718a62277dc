// Internal to cuda/: the on-device converting copy (cuda/copy.cu). cuda/copy.cpp builds
// host<->device and peer transfers on it, and the reductions pack strided inputs with it.
#pragma once

#include "core/tensor.h"

namespace loom::cuda {

// dst = src element for element, converting dtype (16-bit floats through float, as on
// the CPU); same shape, both on the same CUDA device, any strides. Same dtype and both
// contiguous is a cudaMemcpyAsync. Queued on the device's current stream.
void copy_on_device(const Tensor& src, Tensor& dst);

// `t` itself if contiguous, else a contiguous copy on the same device (copy_on_device).
Tensor contiguous_on_device(const Tensor& t);

}  // namespace loom::cuda
