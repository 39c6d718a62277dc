// loom's Winograd passes for channels-last (NHWC) activations: the same tiles, filters
// and transforms as the NCHW passes of winograd_conv2d.cpp, with the channels, not the
// tiles, in the vector lanes (Note [Winograd in channels-last], winograd_channels_last.cpp).
// core/cpu/winograd_conv2d.h's entry points call these for channels-last tensors.
#pragma once

#include <cstdint>

#include "core/cpu/conv2d_reference.h"  // defines: Conv2dGeometry

namespace loom::cpu::winograd {

// out (NHWC, out_channels) = the forward pass of input (NHWC, in_channels) with the
// transformed filters u, transposed (alpha^2 x in_channels x out_channels), + bias (may be null):
// the convolution itself, or with flipped filters the input gradient (Note [Winograd
// gradients]).
template <int M>
void forward_tiles_channels_last(const Conv2dGeometry& g, int64_t in_channels, int64_t out_channels,
                                 const float* input, const float* u, const float* bias, float* out);

// grad_weight (OIHW) from input and grad_out, both NHWC.
template <int M>
void backward_weights_channels_last(const Conv2dGeometry& g, const float* input, const float* grad_out,
                                   float* grad_weight);

// grad_bias[o] = grad_out (NHWC) summed over every pixel of the batch, the same bits for
// any number of threads.
void bias_gradient_channels_last(const Conv2dGeometry& g, const float* grad_out, float* grad_bias);

}  // namespace loom::cpu::winograd
