// loom's own Winograd convolution on the CPU: 3x3, stride 1, padding 1 (a ResNet's
// main convolutions), float32, all three passes, on NCHW or channels-last (NHWC)
// activations as they are (Note [Winograd in channels-last], winograd_channels_last.cpp).
//
// oneDNN has Winograd kernels only for AVX-512; on AVX2 CPUs these take their place
// (Note [Conv2d algorithm], core/cpu/conv2d.cpp, says which runs when). The tile
// transforms are in core/cpu/winograd_transforms.h (Note [Winograd tiles]), the passes
// and their blocking in winograd_conv2d.cpp.
#pragma once

#include "core/cpu/conv2d_reference.h"  // defines: Conv2dGeometry

namespace loom::cpu {

// Whether this convolution is one these kernels compute: 3x3, stride 1, padding 1,
// dilation 1, one group (so the output is the input's size).
bool winograd_applies(const Conv2dGeometry& g);

// The output tile side m of F(m x m, 3 x 3) for this image size: 4, or 2 where 4x4
// tiles would mostly cover padding (Note [Winograd tile size], winograd_conv2d.cpp).
int winograd_tile(const Conv2dGeometry& g);

// Every activation (input, output and their gradients) is NCHW, or NHWC where
// channels_last; weights are OIHW either way.

// out = conv(input, weight) + bias (bias may be null).
void winograd_forward(const Conv2dGeometry& g, const float* input, const float* weight, const float* bias,
                      float* out, bool channels_last);

// grad_input = the input gradient for grad_out (the same size).
void winograd_backward_data(const Conv2dGeometry& g, const float* grad_out, const float* weight, float* grad_input,
                            bool channels_last);

// grad_weight (OIHW) = the weight gradient; grad_bias (may be null) = grad_out summed
// over every axis but the channel.
void winograd_backward_weights(const Conv2dGeometry& g, const float* input, const float* grad_out, float* grad_weight,
                               float* grad_bias, bool channels_last);

}  // namespace loom::cpu
