// Patch whitening: a first convolution whose filters decorrelate the image's patches, set
// from the data before training (the "whitening layer" of the CIFAR-10 speedruns, after
// Coates & Ng's ZCA-like preprocessing, used by Page's ResNet speedrun and by airbench).
//
//   auto whiten = std::make_shared<nn::Conv2d>(3, 24, /*kernel_size=*/2, 1, 0);   // 2 * 3*2*2 filters
//   nn::init_whitening_conv_(*whiten, train_images.narrow(0, 0, 5000), /*eps=*/5e-4);
//   whiten->weight.requires_grad_(false);                                          // frozen
//
// Note [Whitening filters]
// Take every k x k patch of the images (stride 1, no padding) as a vector x of C*k*k values,
// ordered (c, h, w) as the conv weight is. Their second moment  S = X^T X / n  (no mean
// subtracted: the images are normalised already, and the conv's bias can learn any offset)
// has eigenvectors v_i and eigenvalues l_i. The filter w_i = v_i / sqrt(l_i + eps) maps a
// patch to  <v_i, x> / sqrt(l_i + eps), whose second moment over the patches is
// l_i / (l_i + eps): about 1, and exactly uncorrelated with every other filter's output. So
// the conv's outputs are the patches in the basis of their principal components, each scaled
// to unit variance: the whitened image. eps keeps the smallest components (pixel noise)
// from being amplified without bound. The filters are sorted by decreasing eigenvalue and
// followed by their negatives (2 * C*k*k filters), so that a GELU after the conv keeps each
// direction's positive and negative half (a conv of C*k*k filters would lose half of them).
#pragma once

#include <utility>

#include "core/tensor.h"
#include "nn/conv.h"  // defines: Conv2d

namespace loom::nn {

// [n_patches, C*kh*kw]: every kh x kw patch of `images` ([N, C, H, W], CPU, float32 or
// float64), stride 1, in the order (image, row, column), each patch as (c, h, w). As
// torch's x.unfold(2, kh, 1).unfold(3, kw, 1) flattened per patch; float64.
Tensor image_patches(const Tensor& images, int64_t kh, int64_t kw);

// The eigenvalues (descending) and unit eigenvectors (rows, [C*kh*kw] each, same order)
// of the patches' second moment X^T X / n, in float64. See Note [Whitening filters].
std::pair<Tensor, Tensor> patch_principal_components(const Tensor& images, int64_t kh, int64_t kw);

// Sets conv.weight to the whitening filters of `images` (Note [Whitening filters]) and its
// bias, if any, to zero. The conv must be [2 * C*kh*kw, C, kh, kw] with stride 1 and no
// dilation or groups; the images [N, C, H, W] in the normalisation the network will see.
void init_whitening_conv_(Conv2d& conv, const Tensor& images, double eps = 5e-4);

}  // namespace loom::nn
