#include "nn/whitening.h"

#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"  // defines: mm, transpose, cat
#include "core/copy.h"
#include "core/eigh.h"     // defines: linalg::eigh (LAPACK dsyevd)

namespace loom::nn {

Tensor image_patches(const Tensor& images, int64_t kh, int64_t kw) {
  LOOM_CHECK(images.defined() && images.dim() == 4, "image_patches: expected images [N, C, H, W], got ",
             images.defined() ? detail::str(images.shape()) : std::string("an undefined tensor"));
  LOOM_CHECK(images.device().is_cpu(), "image_patches: expected CPU images, got ", images.device());
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  LOOM_CHECK(kh > 0 && kw > 0 && kh <= h && kw <= w, "image_patches: a ", kh, "x", kw, " patch does not fit images of ",
             h, "x", w);
  const int64_t oh = h - kh + 1, ow = w - kw + 1, dim = c * kh * kw;
  const std::vector<double> pixels = images.contiguous().to(kFloat64).tolist<double>();
  std::vector<double> out(static_cast<size_t>(n * oh * ow * dim));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        double* row = &out[static_cast<size_t>(((i * oh + y) * ow + x) * dim)];
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t dy = 0; dy < kh; ++dy)
            for (int64_t dx = 0; dx < kw; ++dx)
              *row++ = pixels[static_cast<size_t>(((i * c + ch) * h + y + dy) * w + x + dx)];
      }
  return from_vector(out, {n * oh * ow, dim});
}

std::pair<Tensor, Tensor> patch_principal_components(const Tensor& images, int64_t kh, int64_t kw) {
  NoGradGuard no_grad;
  // The second moment, summed over chunks of images so the patch matrix stays small (5,000
  // CIFAR images have 4.8 M 2x2 patches: 370 MB in float64 at once, 19 MB a chunk of 256).
  const int64_t n = images.size(0), chunk = 256;
  Tensor moment;
  int64_t count = 0;
  for (int64_t start = 0; start < n; start += chunk) {
    const Tensor patches = image_patches(images.narrow(0, start, std::min(chunk, n - start)), kh, kw);
    const Tensor part = mm(transpose(patches, 0, 1), patches);
    moment = moment.defined() ? moment + part : part;
    count += patches.size(0);
  }
  LOOM_CHECK(count > 0, "patch_principal_components: no images given");
  auto [values, vectors] = linalg::eigh(moment / static_cast<double>(count));  // ascending, columns
  // Descending, each eigenvector a row: reverse the order of values and of vectors' columns.
  const Tensor reversed_values = flip(values, {0});
  const Tensor rows = flip(transpose(vectors, 0, 1), {0});
  return {reversed_values, rows.contiguous()};
}

void init_whitening_conv_(Conv2d& conv, const Tensor& images, double eps) {
  LOOM_CHECK(images.defined() && images.dim() == 4 && images.size(1) == conv.in_channels,
             "init_whitening_conv_: expected images [N, ", conv.in_channels, ", H, W] for a conv with ",
             conv.in_channels, " input channels, got ",
             images.defined() ? detail::str(images.shape()) : std::string("an undefined tensor"));
  const int64_t kh = conv.kernel_size.h, kw = conv.kernel_size.w, dim = conv.in_channels * kh * kw;
  LOOM_CHECK(conv.out_channels == 2 * dim, "init_whitening_conv_: a ", kh, "x", kw, " conv on ", conv.in_channels,
             " channels has ", dim, " whitening directions and needs 2 * ", dim, " = ", 2 * dim,
             " output channels (each filter and its negative), got ", conv.out_channels);
  LOOM_CHECK(conv.stride.h == 1 && conv.stride.w == 1 && conv.dilation.h == 1 && conv.dilation.w == 1 &&
                 conv.groups == 1,
             "init_whitening_conv_: expected stride 1, dilation 1 and groups 1 (the patches are taken at every "
             "position), got ", conv.extra_repr());
  LOOM_CHECK(eps >= 0, "init_whitening_conv_: eps must be non-negative, got ", eps);
  NoGradGuard no_grad;
  auto [values, vectors] = patch_principal_components(images, kh, kw);
  // See Note [Whitening filters]: v_i / sqrt(l_i + eps), then the negatives.
  const Tensor scale = rsqrt(values + eps).unsqueeze(1);
  const Tensor filters = vectors * scale;
  const Tensor weight = cat({filters, -filters}, 0).view({2 * dim, conv.in_channels, kh, kw});
  Tensor target = conv.weight.detach();
  copy_into(target, weight.to(target.dtype()).to(target.device()));
  conv.weight.bump_version();
  if (conv.bias.defined()) {
    Tensor bias = conv.bias.detach();
    bias.zero_();
    conv.bias.bump_version();
  }
}

}  // namespace loom::nn
