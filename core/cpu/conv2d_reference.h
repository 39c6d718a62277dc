// Conv2dGeometry (every size a conv2d kernel needs, derived once) and the direct-loop
// reference convolution used for float64.
//
// float64 exists for gradient checks, where exactness matters and sizes are tiny, so
// these loops are written to be obviously right rather than fast: each output element is
// a sum written the way the definition reads, with OpenMP over independent outputs.
// The gradients are *gather* forms (each thread owns the elements it writes), so no
// atomics and no zero-initialisation are needed.
//
//   out[n, o, y, x] = bias[o] + sum_{c in group(o), i, j}
//                     in[n, c, y*sh - ph + i*dh, x*sw - pw + j*dw] * weight[o, c - c0, i, j]
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/kernels.h"
#include "core/shape.h"

namespace loom::cpu {

// Below this many multiply-adds a pass runs on one thread: waking OpenMP's team costs
// more than the loop, and gradient checks run thousands of tiny convolutions.
constexpr int64_t kConvParallelMacs = 1 << 16;

struct Conv2dGeometry {
  int64_t n, c, h, w;   // input
  int64_t o, kh, kw;    // weight [o, c / groups, kh, kw]
  int64_t oh, ow;       // output
  int64_t sh, sw, ph, pw, dh, dw, groups;

  // Shapes were validated by loom::conv2d (autograd/ops/conv.cpp).
  Conv2dGeometry(const Shape& input, const Shape& weight, const Conv2dParams& p)
      : n(input[0]), c(input[1]), h(input[2]), w(input[3]),
        o(weight[0]), kh(weight[2]), kw(weight[3]),
        oh((h + 2 * p.padding[0] - p.dilation[0] * (kh - 1) - 1) / p.stride[0] + 1),
        ow((w + 2 * p.padding[1] - p.dilation[1] * (kw - 1) - 1) / p.stride[1] + 1),
        sh(p.stride[0]), sw(p.stride[1]), ph(p.padding[0]), pw(p.padding[1]),
        dh(p.dilation[0]), dw(p.dilation[1]), groups(p.groups) {}

  auto operator<=>(const Conv2dGeometry&) const = default;

  // Multiply-adds of one pass (forward, input gradient and weight gradient alike).
  int64_t macs() const { return n * o * oh * ow * (c / groups) * kh * kw; }

  std::string str() const {
    return detail::str("input ", shape_str({n, c, h, w}), ", weight ", shape_str({o, c / groups, kh, kw}),
                       ", output ", shape_str({n, o, oh, ow}), ", stride [", sh, ", ", sw, "], padding [", ph, ", ",
                       pw, "], dilation [", dh, ", ", dw, "], groups ", groups);
  }
};

template <typename T>
void conv2d_reference_forward(const Conv2dGeometry& g, const T* in, const T* weight, const T* bias, T* out) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
#pragma omp parallel for collapse(2) schedule(static) if (g.macs() > kConvParallelMacs)
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t o = 0; o < g.o; ++o) {
      const int64_t c0 = (o / og) * cg;
      T* y = out + (n * g.o + o) * g.oh * g.ow;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          T acc = bias ? bias[o] : T(0);
          for (int64_t c = 0; c < cg; ++c) {
            const T* x = in + (n * g.c + c0 + c) * g.h * g.w;
            const T* k = weight + (o * cg + c) * g.kh * g.kw;
            for (int64_t i = 0; i < g.kh; ++i) {
              const int64_t iy = oy * g.sh - g.ph + i * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t ix = ox * g.sw - g.pw + j * g.dw;
                if (ix >= 0 && ix < g.w) acc += x[iy * g.w + ix] * k[i * g.kw + j];
              }
            }
          }
          y[oy * g.ow + ox] = acc;
        }
      }
    }
  }
}

// The output index that input index `in` meets through kernel tap `tap` along one
// axis, or -1 when no output does (the tap lands between strides or outside).
inline int64_t conv_source_index(int64_t in, int64_t tap, int64_t stride, int64_t pad, int64_t dilation,
                                 int64_t out_size) {
  const int64_t t = in + pad - tap * dilation;
  if (t < 0 || t % stride != 0) return -1;
  const int64_t index = t / stride;
  return index < out_size ? index : -1;
}

// grad_in[n, c, y, x] = sum over the outputs that read in[n, c, y, x] of grad_out * weight.
template <typename T>
void conv2d_reference_backward_data(const Conv2dGeometry& g, const T* grad_out, const T* weight, T* grad_in) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
#pragma omp parallel for collapse(2) schedule(static) if (g.macs() > kConvParallelMacs)
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t c = 0; c < g.c; ++c) {
      const int64_t o0 = (c / cg) * og, cc = c % cg;
      T* gx = grad_in + (n * g.c + c) * g.h * g.w;
      for (int64_t iy = 0; iy < g.h; ++iy) {
        for (int64_t ix = 0; ix < g.w; ++ix) {
          T acc = T(0);
          for (int64_t i = 0; i < g.kh; ++i) {
            const int64_t oy = conv_source_index(iy, i, g.sh, g.ph, g.dh, g.oh);
            if (oy < 0) continue;
            for (int64_t j = 0; j < g.kw; ++j) {
              const int64_t ox = conv_source_index(ix, j, g.sw, g.pw, g.dw, g.ow);
              if (ox < 0) continue;
              for (int64_t o = o0; o < o0 + og; ++o) {
                acc += grad_out[((n * g.o + o) * g.oh + oy) * g.ow + ox] *
                       weight[((o * cg + cc) * g.kh + i) * g.kw + j];
              }
            }
          }
          gx[iy * g.w + ix] = acc;
        }
      }
    }
  }
}

// grad_weight[o, c, i, j] = sum over n, y, x of grad_out[n, o, y, x] * in[n, c0 + c, tap].
template <typename T>
void conv2d_reference_backward_weights(const Conv2dGeometry& g, const T* grad_out, const T* in, T* grad_weight) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
#pragma omp parallel for collapse(2) schedule(static) if (g.macs() > kConvParallelMacs)
  for (int64_t o = 0; o < g.o; ++o) {
    for (int64_t c = 0; c < cg; ++c) {
      const int64_t c0 = (o / og) * cg;
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          T acc = T(0);
          for (int64_t n = 0; n < g.n; ++n) {
            const T* gy = grad_out + (n * g.o + o) * g.oh * g.ow;
            const T* x = in + (n * g.c + c0 + c) * g.h * g.w;
            for (int64_t oy = 0; oy < g.oh; ++oy) {
              const int64_t iy = oy * g.sh - g.ph + i * g.dh;
              if (iy < 0 || iy >= g.h) continue;
              for (int64_t ox = 0; ox < g.ow; ++ox) {
                const int64_t ix = ox * g.sw - g.pw + j * g.dw;
                if (ix >= 0 && ix < g.w) acc += gy[oy * g.ow + ox] * x[iy * g.w + ix];
              }
            }
          }
          grad_weight[((o * cg + c) * g.kh + i) * g.kw + j] = acc;
        }
      }
    }
  }
}

template <typename T>
void conv2d_reference_backward_bias(const Conv2dGeometry& g, const T* grad_out, T* grad_bias) {
#pragma omp parallel for schedule(static) if (g.n * g.o * g.oh * g.ow > kConvParallelMacs)
  for (int64_t o = 0; o < g.o; ++o) {
    T acc = T(0);
    for (int64_t n = 0; n < g.n; ++n) {
      const T* gy = grad_out + (n * g.o + o) * g.oh * g.ow;
      for (int64_t k = 0; k < g.oh * g.ow; ++k) acc += gy[k];
    }
    grad_bias[o] = acc;
  }
}

}  // namespace loom::cpu
