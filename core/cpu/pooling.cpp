// CPU pooling kernels: max_pool2d, avg_pool2d, adaptive_avg_pool2d, forward and backward.
//
// Every kernel works on *planes*: an input [N, C, H, W] (or [C, H, W]) is numel/(H*W)
// independent H x W images, and each output plane depends on one input plane only. So
// the planes are split across OpenMP threads and no two threads ever write the same
// element, in forward or backward. Output sizes come from `out` / `grad_out`: the
// autograd op (autograd/ops/nn.cpp) has already validated the parameters and computed
// them with PyTorch's formula.
//
// Window arithmetic is PyTorch's CPU kernels', so results (and the argmax chosen on
// ties and NaNs) are identical:
// - max: the window starts at o*stride - pad, steps by dilation, clipped to the image;
//   the first strict maximum wins, and a NaN always wins (NaN propagates).
// - avg: the window [o*stride - pad, + kernel) is clipped to the padded image to give
//   the count_include_pad divisor, then to the image to give the summed elements.
// - adaptive avg: output i averages input [floor(i*H/OH), ceil((i+1)*H/OH)).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu/contiguous.h"
#include "core/kernels.h"
#include "core/pooling_geometry.h"  // defines: PoolPlanes, pool_planes_of, first_inside

namespace loom::cpu {
namespace {

// Below this much work (roughly, element visits) a thread team costs more than it saves.
constexpr int64_t kPoolGrain = 1 << 15;



template <typename T>
void max_pool2d_forward_typed(const Tensor& in_any, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  const Tensor in = contiguous_input(in_any);
  const PoolPlanes g = pool_planes_of(in, out);
  const T* x = in.data_ptr<T>();
  T* y = out.data_ptr<T>();
  int64_t* arg = indices.data_ptr<int64_t>();
  const int64_t kh = p.kernel[0], kw = p.kernel[1], sh = p.stride[0], sw = p.stride[1];
  const int64_t ph = p.padding[0], pw = p.padding[1], dh = p.dilation[0], dw = p.dilation[1];
  const int64_t work = g.count * g.out_h * g.out_w * kh * kw;

#pragma omp parallel for schedule(static) if (work > kPoolGrain && g.count > 1)
  for (int64_t plane = 0; plane < g.count; ++plane) {
    const T* xp = x + plane * g.in_h * g.in_w;
    T* yp = y + plane * g.out_h * g.out_w;
    int64_t* ap = arg + plane * g.out_h * g.out_w;
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const int64_t h_end = std::min(oh * sh - ph + (kh - 1) * dh + 1, g.in_h);
      const int64_t h_begin = first_inside(oh * sh - ph, dh);
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const int64_t w_end = std::min(ow * sw - pw + (kw - 1) * dw + 1, g.in_w);
        const int64_t w_begin = first_inside(ow * sw - pw, dw);
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_index = h_begin * g.in_w + w_begin;
        for (int64_t h = h_begin; h < h_end; h += dh) {
          for (int64_t w = w_begin; w < w_end; w += dw) {
            const T v = xp[h * g.in_w + w];
            if (v > best || std::isnan(v)) {
              best = v;
              best_index = h * g.in_w + w;
            }
          }
        }
        yp[oh * g.out_w + ow] = best;
        ap[oh * g.out_w + ow] = best_index;
      }
    }
  }
}

void max_pool2d_forward_cpu(const Tensor& in, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  check_output_dense("max_pool2d", out);
  check_output_dense("max_pool2d", indices);
  dispatch_floating(in.dtype(), "max_pool2d", [&]<typename T>() { max_pool2d_forward_typed<T>(in, p, out, indices); });
}

void max_pool2d_backward_cpu(const Tensor& grad_out_any, const Tensor& indices_any, Tensor& grad_in) {
  check_output_dense("max_pool2d_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  const Tensor indices = contiguous_input(indices_any);
  dispatch_floating(grad_out.dtype(), "max_pool2d_backward", [&]<typename T>() {
    const PoolPlanes g = pool_planes_of(grad_in, grad_out);
    const T* gy = grad_out.data_ptr<T>();
    const int64_t* arg = indices.data_ptr<int64_t>();
    T* gx = grad_in.data_ptr<T>();
    const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
#pragma omp parallel for schedule(static) if (g.count * (in_plane + out_plane) > kPoolGrain && g.count > 1)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      T* gxp = gx + plane * in_plane;
      for (int64_t i = 0; i < in_plane; ++i) gxp[i] = T(0);
      const T* gyp = gy + plane * out_plane;
      const int64_t* ap = arg + plane * out_plane;
      // Overlapping windows (stride < kernel) can pick the same element: accumulate.
      for (int64_t o = 0; o < out_plane; ++o) {
        if (ap[o] >= 0 && ap[o] < in_plane) gxp[ap[o]] += gyp[o];
      }
    }
  });
}

// avg_pool2d's window for output (oh, ow): the summed box and its divisor.
struct AvgWindow {
  int64_t h_begin, h_end, w_begin, w_end, divisor;
};

inline AvgWindow avg_window(const Pool2dParams& p, const PoolPlanes& g, int64_t oh, int64_t ow) {
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  int64_t h1 = std::min(h0 + p.kernel[0], g.in_h + p.padding[0]);
  int64_t w1 = std::min(w0 + p.kernel[1], g.in_w + p.padding[1]);
  const int64_t padded_area = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, g.in_h);
  w1 = std::min(w1, g.in_w);
  return {h0, h1, w0, w1, p.count_include_pad ? padded_area : (h1 - h0) * (w1 - w0)};
}

void avg_pool2d_forward_cpu(const Tensor& in_any, const Pool2dParams& p, Tensor& out) {
  check_output_dense("avg_pool2d", out);
  const Tensor in = contiguous_input(in_any);
  dispatch_floating(in.dtype(), "avg_pool2d", [&]<typename T>() {
    const PoolPlanes g = pool_planes_of(in, out);
    const T* x = in.data_ptr<T>();
    T* y = out.data_ptr<T>();
    const int64_t work = g.count * g.out_h * g.out_w * p.kernel[0] * p.kernel[1];
#pragma omp parallel for schedule(static) if (work > kPoolGrain && g.count > 1)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      const T* xp = x + plane * g.in_h * g.in_w;
      T* yp = y + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const AvgWindow win = avg_window(p, g, oh, ow);
          T sum = T(0);
          for (int64_t h = win.h_begin; h < win.h_end; ++h)
            for (int64_t w = win.w_begin; w < win.w_end; ++w) sum += xp[h * g.in_w + w];
          // An empty window (only possible when it lies wholly in the padding) is 0.
          yp[oh * g.out_w + ow] = win.h_begin < win.h_end && win.w_begin < win.w_end ? sum / T(win.divisor) : T(0);
        }
      }
    }
  });
}

void avg_pool2d_backward_cpu(const Tensor& grad_out_any, const Pool2dParams& p, Tensor& grad_in) {
  check_output_dense("avg_pool2d_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  dispatch_floating(grad_out.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    const PoolPlanes g = pool_planes_of(grad_in, grad_out);
    const T* gy = grad_out.data_ptr<T>();
    T* gx = grad_in.data_ptr<T>();
    const int64_t work = g.count * (g.in_h * g.in_w + g.out_h * g.out_w * p.kernel[0] * p.kernel[1]);
#pragma omp parallel for schedule(static) if (work > kPoolGrain && g.count > 1)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      T* gxp = gx + plane * g.in_h * g.in_w;
      for (int64_t i = 0; i < g.in_h * g.in_w; ++i) gxp[i] = T(0);
      const T* gyp = gy + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const AvgWindow win = avg_window(p, g, oh, ow);
          const T share = gyp[oh * g.out_w + ow] / T(win.divisor);
          for (int64_t h = win.h_begin; h < win.h_end; ++h)
            for (int64_t w = win.w_begin; w < win.w_end; ++w) gxp[h * g.in_w + w] += share;
        }
      }
    }
  });
}

// PyTorch's adaptive window bounds: [floor(i*size/out), ceil((i+1)*size/out)).
inline int64_t adaptive_begin(int64_t i, int64_t out, int64_t size) { return (i * size) / out; }
inline int64_t adaptive_end(int64_t i, int64_t out, int64_t size) { return ((i + 1) * size + out - 1) / out; }

void adaptive_avg_pool2d_forward_cpu(const Tensor& in_any, Tensor& out) {
  check_output_dense("adaptive_avg_pool2d", out);
  const Tensor in = contiguous_input(in_any);
  dispatch_floating(in.dtype(), "adaptive_avg_pool2d", [&]<typename T>() {
    const PoolPlanes g = pool_planes_of(in, out);
    const T* x = in.data_ptr<T>();
    T* y = out.data_ptr<T>();
    const int64_t area = g.in_h * g.in_w;
    const bool parallel = g.count * area > kPoolGrain && g.count > 1;
    if (g.out_h == 1 && g.out_w == 1) {
      // Global average pooling (ResNet's head): one vectorised sum per plane.
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t plane = 0; plane < g.count; ++plane) {
        const T* xp = x + plane * area;
        T sum = T(0);
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < area; ++i) sum += xp[i];
        y[plane] = sum / T(area);
      }
      return;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      const T* xp = x + plane * area;
      T* yp = y + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t h0 = adaptive_begin(oh, g.out_h, g.in_h), h1 = adaptive_end(oh, g.out_h, g.in_h);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const int64_t w0 = adaptive_begin(ow, g.out_w, g.in_w), w1 = adaptive_end(ow, g.out_w, g.in_w);
          T sum = T(0);
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) sum += xp[h * g.in_w + w];
          yp[oh * g.out_w + ow] = sum / T((h1 - h0) * (w1 - w0));
        }
      }
    }
  });
}

void adaptive_avg_pool2d_backward_cpu(const Tensor& grad_out_any, Tensor& grad_in) {
  check_output_dense("adaptive_avg_pool2d_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  dispatch_floating(grad_out.dtype(), "adaptive_avg_pool2d_backward", [&]<typename T>() {
    const PoolPlanes g = pool_planes_of(grad_in, grad_out);
    const T* gy = grad_out.data_ptr<T>();
    T* gx = grad_in.data_ptr<T>();
    const int64_t area = g.in_h * g.in_w;
    const bool parallel = g.count * area > kPoolGrain && g.count > 1;
    if (g.out_h == 1 && g.out_w == 1) {
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t plane = 0; plane < g.count; ++plane) {
        const T share = gy[plane] / T(area);
        T* gxp = gx + plane * area;
#pragma omp simd
        for (int64_t i = 0; i < area; ++i) gxp[i] = share;
      }
      return;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      T* gxp = gx + plane * area;
      for (int64_t i = 0; i < area; ++i) gxp[i] = T(0);
      const T* gyp = gy + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t h0 = adaptive_begin(oh, g.out_h, g.in_h), h1 = adaptive_end(oh, g.out_h, g.in_h);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const int64_t w0 = adaptive_begin(ow, g.out_w, g.in_w), w1 = adaptive_end(ow, g.out_w, g.in_w);
          // Windows overlap when the size does not divide evenly: accumulate.
          const T share = gyp[oh * g.out_w + ow] / T((h1 - h0) * (w1 - w0));
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) gxp[h * g.in_w + w] += share;
        }
      }
    }
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(max_pool2d_forward_kernel, DeviceType::CPU, max_pool2d_forward_cpu);
LOOM_REGISTER_KERNEL(max_pool2d_backward_kernel, DeviceType::CPU, max_pool2d_backward_cpu);
LOOM_REGISTER_KERNEL(avg_pool2d_forward_kernel, DeviceType::CPU, avg_pool2d_forward_cpu);
LOOM_REGISTER_KERNEL(avg_pool2d_backward_kernel, DeviceType::CPU, avg_pool2d_backward_cpu);
LOOM_REGISTER_KERNEL(adaptive_avg_pool2d_forward_kernel, DeviceType::CPU, adaptive_avg_pool2d_forward_cpu);
LOOM_REGISTER_KERNEL(adaptive_avg_pool2d_backward_kernel, DeviceType::CPU, adaptive_avg_pool2d_backward_cpu);

}  // namespace loom::cpu
