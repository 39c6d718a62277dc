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
//
// bfloat16 runs natively: values are widened to float as they are read and rounded
// once as they are written (Note [bfloat16 conversion in registers]). Max pooling's
// forward only moves values, so it is exact. See Note [Pooling gradients accumulate in
// the compute type] for the backward.
#include <algorithm>
#include <cmath>
#include <limits>

#include <vector>

#include "core/cpu/bf16_convert.h"  // defines: compute_t, widen, narrow, dispatch_floating_16bit
#include "core/cpu/contiguous.h"
#include "core/kernels.h"
#include "core/pooling_geometry.h"  // defines: PoolPlanes, pool_planes_of, first_inside

namespace loom::cpu {
namespace {

// Below this much work (roughly, element visits) a thread team costs more than it saves.
constexpr int64_t kPoolGrain = 1 << 15;

// Note [Pooling gradients accumulate in the compute type]
// The backward kernels add each output's share into the input plane, and windows may
// overlap (stride < kernel, uneven adaptive bins), so an element can receive several
// shares. For float and double they accumulate in grad_in itself; for bfloat16 they
// accumulate in a float plane owned by the thread and are rounded once per element, as
// the float32 kernel's result would be, instead of once per share.
template <typename E>
class PlaneAccumulator {
 public:
  using T = compute_t<E>;
  explicit PlaneAccumulator(int64_t size) : size_(size) {
    if constexpr (!std::is_same_v<E, T>) buffer_.resize(static_cast<size_t>(size));
  }
  // A zeroed plane to add into: `plane` itself, or the float buffer for bfloat16.
  T* zeroed(E* plane) {
    T* acc;
    if constexpr (std::is_same_v<E, T>) acc = plane;
    else acc = buffer_.data();
    std::fill_n(acc, size_, T(0));
    return acc;
  }
  // Rounds the buffer into `plane` (nothing to do when the plane was the buffer).
  void store(E* plane) const {
    if constexpr (!std::is_same_v<E, T>) {
#pragma omp simd
      for (int64_t i = 0; i < size_; ++i) narrow_into(plane[i], buffer_[static_cast<size_t>(i)]);
    }
  }

 private:
  int64_t size_;
  std::vector<T> buffer_;
};

// Note [Max pooling without padding]
// With no padding and no dilation (MaxPool2d(k), the usual case) every window lies inside
// the image (floor mode: (out - 1) * stride + kernel <= in), so the clipping arithmetic of
// the general loop is dead weight; for a 2x2 window it cost more than the comparisons
// (139 ms for [1024, 64, 31, 31] at 2 threads, the speedrun's first pool). This loop runs
// the same comparisons in the same order (first strict maximum wins, NaN wins), so the
// values and the argmax are those of the general loop, bit for bit. The comparisons are
// written as selects: on real activations whether the next value is larger is a coin toss,
// and as branches they mispredicted about once per window (the loop ran at 17 ns a window).
// The 2x2 stride-2 window (every pool of the speedrun's net but its last) as two passes over
// each output row: the maximum by max(), which vectorises, then the index of its first
// occurrence by equality tests. The same answer as the comparison chain (the first strict
// maximum), without its unpredictable branches; a window holding a NaN takes the chain.
template <typename E>
void max_pool2d_2x2_plane(const E* xp, E* yp, int64_t* ap, const PoolPlanes& g) {
  using T = compute_t<E>;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const E* r0 = xp + 2 * oh * g.in_w;
    const E* r1 = r0 + g.in_w;
    E* y = yp + oh * g.out_w;
    int64_t* a = ap + oh * g.out_w;
    const int64_t base = 2 * oh * g.in_w;
    bool any_nan = false;
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const T v0 = widen(r0[2 * ow]), v1 = widen(r0[2 * ow + 1]), v2 = widen(r1[2 * ow]), v3 = widen(r1[2 * ow + 1]);
      const T m = std::max(std::max(v0, v1), std::max(v2, v3));
      y[ow] = narrow<E>(m);
      const int64_t first = v0 == m ? 0 : v1 == m ? 1 : v2 == m ? g.in_w : g.in_w + 1;
      a[ow] = base + 2 * ow + first;
      any_nan |= (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3);
    }
    if (!any_nan) continue;  // the row again only when it holds a NaN
    for (int64_t ow = 0; ow < g.out_w; ++ow) {  // NaN: the chain's rule (the last NaN wins)
      const T v[4] = {widen(r0[2 * ow]), widen(r0[2 * ow + 1]), widen(r1[2 * ow]), widen(r1[2 * ow + 1])};
      if (!(std::isnan(v[0]) || std::isnan(v[1]) || std::isnan(v[2]) || std::isnan(v[3]))) continue;
      const int64_t offsets[4] = {0, 1, g.in_w, g.in_w + 1};
      T best = -std::numeric_limits<T>::infinity();
      int64_t index = base + 2 * ow;
      for (int k = 0; k < 4; ++k)
        if (v[k] > best || std::isnan(v[k])) best = v[k], index = base + 2 * ow + offsets[k];
      y[ow] = narrow<E>(best);
      a[ow] = index;
    }
  }
}

template <typename E, int KH, int KW>
void max_pool2d_unpadded_plane(const E* xp, E* yp, int64_t* ap, const PoolPlanes& g, int64_t sh, int64_t sw,
                               int64_t kh_runtime, int64_t kw_runtime) {
  using T = compute_t<E>;
  const int64_t kh = KH > 0 ? KH : kh_runtime, kw = KW > 0 ? KW : kw_runtime;
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const int64_t h0 = oh * sh;
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const int64_t w0 = ow * sw;
      T best = -std::numeric_limits<T>::infinity();
      int64_t best_index = h0 * g.in_w + w0;
      for (int64_t h = h0; h < h0 + kh; ++h) {
        const E* row = xp + h * g.in_w;
        for (int64_t w = w0; w < w0 + kw; ++w) {
          const T v = widen(row[w]);
          const bool take = (v > best) | (v != v);  // selects, not branches: random data mispredicts half
          best = take ? v : best;
          best_index = take ? h * g.in_w + w : best_index;
        }
      }
      yp[oh * g.out_w + ow] = narrow<E>(best);
      ap[oh * g.out_w + ow] = best_index;
    }
  }
}

template <typename E>
void max_pool2d_forward_typed(const Tensor& in_any, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  using T = compute_t<E>;
  const Tensor in = contiguous_input(in_any);
  const PoolPlanes g = pool_planes_of(in, out);
  const E* x = in.data_ptr<E>();
  E* y = out.data_ptr<E>();
  int64_t* arg = indices.data_ptr<int64_t>();
  const int64_t kh = p.kernel[0], kw = p.kernel[1], sh = p.stride[0], sw = p.stride[1];
  const int64_t ph = p.padding[0], pw = p.padding[1], dh = p.dilation[0], dw = p.dilation[1];
  const int64_t work = g.count * g.out_h * g.out_w * kh * kw;
  const bool inside = ph == 0 && pw == 0 && dh == 1 && dw == 1 && (g.out_h - 1) * sh + kh <= g.in_h &&
                      (g.out_w - 1) * sw + kw <= g.in_w;
  if (inside) {  // See Note [Max pooling without padding]
    const bool two = kh == 2 && kw == 2, three = kh == 3 && kw == 3;
#pragma omp parallel for schedule(static) if (work > kPoolGrain && g.count > 1)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      const E* xp = x + plane * g.in_h * g.in_w;
      E* yp = y + plane * g.out_h * g.out_w;
      int64_t* ap = arg + plane * g.out_h * g.out_w;
      if (two && sh == 2 && sw == 2) max_pool2d_2x2_plane<E>(xp, yp, ap, g);
      else if (two) max_pool2d_unpadded_plane<E, 2, 2>(xp, yp, ap, g, sh, sw, kh, kw);
      else if (three) max_pool2d_unpadded_plane<E, 3, 3>(xp, yp, ap, g, sh, sw, kh, kw);
      else max_pool2d_unpadded_plane<E, 0, 0>(xp, yp, ap, g, sh, sw, kh, kw);
    }
    return;
  }

#pragma omp parallel for schedule(static) if (work > kPoolGrain && g.count > 1)
  for (int64_t plane = 0; plane < g.count; ++plane) {
    const E* xp = x + plane * g.in_h * g.in_w;
    E* yp = y + plane * g.out_h * g.out_w;
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
            const T v = widen(xp[h * g.in_w + w]);
            if (v > best || std::isnan(v)) {
              best = v;
              best_index = h * g.in_w + w;
            }
          }
        }
        yp[oh * g.out_w + ow] = narrow<E>(best);  // exact: an input value or -inf
        ap[oh * g.out_w + ow] = best_index;
      }
    }
  }
}

// Note [Max pooling in channels-last]
// A channels-last [N, C, H, W] tensor holds each pixel's C values side by side, so a window's
// maximum is C independent maxima over the same kh x kw pixels: one vector compare-and-select
// per tap across the channels, with no reorder to NCHW and back. The indices are PyTorch's
// (h * W + w within the channel's plane, whatever the layout) and the rule the same (the
// first strict maximum; a NaN wins), so both layouts give the same values and indices.
// Used for float32/float64 windows without padding or dilation; anything else reorders.
bool max_pool2d_takes_channels_last(const Tensor& in, const Pool2dParams& p, const Tensor& out) {
  return in.dim() == 4 && (in.dtype() == kFloat32 || in.dtype() == kFloat64) &&
         in.is_contiguous(MemoryFormat::ChannelsLast) && out.is_contiguous(MemoryFormat::ChannelsLast) &&
         p.padding[0] == 0 && p.padding[1] == 0 && p.dilation[0] == 1 && p.dilation[1] == 1 &&
         (out.size(2) - 1) * p.stride[0] + p.kernel[0] <= in.size(2) &&
         (out.size(3) - 1) * p.stride[1] + p.kernel[1] <= in.size(3);
}

template <typename T>
void max_pool2d_forward_channels_last(const Tensor& in, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  const int64_t n = in.size(0), c = in.size(1), h = in.size(2), w = in.size(3), oh = out.size(2), ow = out.size(3);
  const int64_t kh = p.kernel[0], kw = p.kernel[1], sh = p.stride[0], sw = p.stride[1];
  const T* x = in.data_ptr<T>();
  T* y = out.data_ptr<T>();
  int64_t* arg = indices.data_ptr<int64_t>();
#pragma omp parallel for collapse(2) schedule(static) if (n * oh * ow * c * kh * kw > kPoolGrain)
  for (int64_t b = 0; b < n; ++b)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        T* yo = y + ((b * oh + i) * ow + j) * c;
        int64_t* ao = arg + ((b * oh + i) * ow + j) * c;
        const T* first = x + ((b * h + i * sh) * w + j * sw) * c;
        const int64_t first_index = i * sh * w + j * sw;
#pragma omp simd
        for (int64_t ch = 0; ch < c; ++ch) {
          yo[ch] = first[ch];
          ao[ch] = first_index;
        }
        for (int64_t dy = 0; dy < kh; ++dy)
          for (int64_t dx = dy == 0 ? 1 : 0; dx < kw; ++dx) {
            const T* tap = x + ((b * h + i * sh + dy) * w + j * sw + dx) * c;
            const int64_t index = (i * sh + dy) * w + j * sw + dx;
#pragma omp simd
            for (int64_t ch = 0; ch < c; ++ch) {
              const T v = tap[ch];
              const bool take = (v > yo[ch]) | (v != v);  // See Note [Max pooling in channels-last]
              yo[ch] = take ? v : yo[ch];
              ao[ch] = take ? index : ao[ch];
            }
          }
      }
}

template <typename T>
void max_pool2d_backward_channels_last(const Tensor& grad_out, const Tensor& indices, Tensor& grad_in) {
  const int64_t n = grad_in.size(0), c = grad_in.size(1), h = grad_in.size(2), w = grad_in.size(3);
  const int64_t oh = grad_out.size(2), ow = grad_out.size(3);
  const T* gy = grad_out.data_ptr<T>();
  const int64_t* arg = indices.data_ptr<int64_t>();
  T* gx = grad_in.data_ptr<T>();
#pragma omp parallel for schedule(static) if (n * (h * w + oh * ow) * c > kPoolGrain)
  for (int64_t b = 0; b < n; ++b) {  // each image's gradient is its own: no two threads write one element
    T* gxb = gx + b * h * w * c;
    std::fill_n(gxb, h * w * c, T(0));
    for (int64_t o = 0; o < oh * ow; ++o) {
      const T* g = gy + (b * oh * ow + o) * c;
      const int64_t* a = arg + (b * oh * ow + o) * c;
      for (int64_t ch = 0; ch < c; ++ch)
        if (a[ch] >= 0 && a[ch] < h * w) gxb[a[ch] * c + ch] += g[ch];
    }
  }
}

void max_pool2d_forward_cpu(const Tensor& in, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  if (max_pool2d_takes_channels_last(in, p, out) && indices.is_contiguous(MemoryFormat::ChannelsLast)) {
    dispatch_floating(in.dtype(), "max_pool2d", [&]<typename T>() { max_pool2d_forward_channels_last<T>(in, p, out, indices); });
    return;
  }
  check_output_dense("max_pool2d", out);
  check_output_dense("max_pool2d", indices);
  dispatch_floating_16bit(in.dtype(), "max_pool2d", [&]<typename E>() { max_pool2d_forward_typed<E>(in, p, out, indices); });
}

void max_pool2d_backward_cpu(const Tensor& grad_out_any, const Tensor& indices_any, Tensor& grad_in) {
  if (grad_in.dim() == 4 && (grad_in.dtype() == kFloat32 || grad_in.dtype() == kFloat64) &&
      grad_in.is_contiguous(MemoryFormat::ChannelsLast) && indices_any.is_contiguous(MemoryFormat::ChannelsLast) &&
      grad_out_any.dtype() == grad_in.dtype()) {  // See Note [Max pooling in channels-last]
    const Tensor grad_out = grad_out_any.contiguous(MemoryFormat::ChannelsLast);
    dispatch_floating(grad_in.dtype(), "max_pool2d_backward",
                      [&]<typename T>() { max_pool2d_backward_channels_last<T>(grad_out, indices_any, grad_in); });
    return;
  }
  check_output_dense("max_pool2d_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  const Tensor indices = contiguous_input(indices_any);
  dispatch_floating_16bit(grad_out.dtype(), "max_pool2d_backward", [&]<typename E>() {
    const PoolPlanes g = pool_planes_of(grad_in, grad_out);
    const E* gy = grad_out.data_ptr<E>();
    const int64_t* arg = indices.data_ptr<int64_t>();
    E* gx = grad_in.data_ptr<E>();
    const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
#pragma omp parallel if (g.count * (in_plane + out_plane) > kPoolGrain && g.count > 1)
    {
      PlaneAccumulator<E> acc(in_plane);  // See Note [Pooling gradients accumulate in the compute type]
#pragma omp for schedule(static)
      for (int64_t plane = 0; plane < g.count; ++plane) {
        auto* gxp = acc.zeroed(gx + plane * in_plane);
        const E* gyp = gy + plane * out_plane;
        const int64_t* ap = arg + plane * out_plane;
        // Overlapping windows (stride < kernel) can pick the same element: accumulate.
        for (int64_t o = 0; o < out_plane; ++o) {
          if (ap[o] >= 0 && ap[o] < in_plane) gxp[ap[o]] += widen(gyp[o]);
        }
        acc.store(gx + plane * in_plane);
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
  dispatch_floating_16bit(in.dtype(), "avg_pool2d", [&]<typename E>() {
    using T = compute_t<E>;
    const PoolPlanes g = pool_planes_of(in, out);
    const E* x = in.data_ptr<E>();
    E* y = out.data_ptr<E>();
    const int64_t work = g.count * g.out_h * g.out_w * p.kernel[0] * p.kernel[1];
#pragma omp parallel for schedule(static) if (work > kPoolGrain && g.count > 1)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      const E* xp = x + plane * g.in_h * g.in_w;
      E* yp = y + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const AvgWindow win = avg_window(p, g, oh, ow);
          T sum = T(0);
          for (int64_t h = win.h_begin; h < win.h_end; ++h)
            for (int64_t w = win.w_begin; w < win.w_end; ++w) sum += widen(xp[h * g.in_w + w]);
          // An empty window (only possible when it lies wholly in the padding) is 0.
          yp[oh * g.out_w + ow] =
              narrow<E>(win.h_begin < win.h_end && win.w_begin < win.w_end ? sum / T(win.divisor) : T(0));
        }
      }
    }
  });
}

void avg_pool2d_backward_cpu(const Tensor& grad_out_any, const Pool2dParams& p, Tensor& grad_in) {
  check_output_dense("avg_pool2d_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  dispatch_floating_16bit(grad_out.dtype(), "avg_pool2d_backward", [&]<typename E>() {
    using T = compute_t<E>;
    const PoolPlanes g = pool_planes_of(grad_in, grad_out);
    const E* gy = grad_out.data_ptr<E>();
    E* gx = grad_in.data_ptr<E>();
    const int64_t in_plane = g.in_h * g.in_w;
    const int64_t work = g.count * (in_plane + g.out_h * g.out_w * p.kernel[0] * p.kernel[1]);
#pragma omp parallel if (work > kPoolGrain && g.count > 1)
    {
      PlaneAccumulator<E> acc(in_plane);  // See Note [Pooling gradients accumulate in the compute type]
#pragma omp for schedule(static)
      for (int64_t plane = 0; plane < g.count; ++plane) {
        T* gxp = acc.zeroed(gx + plane * in_plane);
        const E* gyp = gy + plane * g.out_h * g.out_w;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const AvgWindow win = avg_window(p, g, oh, ow);
            const T share = widen(gyp[oh * g.out_w + ow]) / T(win.divisor);
            for (int64_t h = win.h_begin; h < win.h_end; ++h)
              for (int64_t w = win.w_begin; w < win.w_end; ++w) gxp[h * g.in_w + w] += share;
          }
        }
        acc.store(gx + plane * in_plane);
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
  dispatch_floating_16bit(in.dtype(), "adaptive_avg_pool2d", [&]<typename E>() {
    using T = compute_t<E>;
    const PoolPlanes g = pool_planes_of(in, out);
    const E* x = in.data_ptr<E>();
    E* y = out.data_ptr<E>();
    const int64_t area = g.in_h * g.in_w;
    const bool parallel = g.count * area > kPoolGrain && g.count > 1;
    if (g.out_h == 1 && g.out_w == 1) {
      // Global average pooling (ResNet's head): one vectorised sum per plane.
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t plane = 0; plane < g.count; ++plane) {
        const E* xp = x + plane * area;
        T sum = T(0);
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < area; ++i) sum += widen(xp[i]);
        y[plane] = narrow<E>(sum / T(area));
      }
      return;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t plane = 0; plane < g.count; ++plane) {
      const E* xp = x + plane * area;
      E* yp = y + plane * g.out_h * g.out_w;
      for (int64_t oh = 0; oh < g.out_h; ++oh) {
        const int64_t h0 = adaptive_begin(oh, g.out_h, g.in_h), h1 = adaptive_end(oh, g.out_h, g.in_h);
        for (int64_t ow = 0; ow < g.out_w; ++ow) {
          const int64_t w0 = adaptive_begin(ow, g.out_w, g.in_w), w1 = adaptive_end(ow, g.out_w, g.in_w);
          T sum = T(0);
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) sum += widen(xp[h * g.in_w + w]);
          yp[oh * g.out_w + ow] = narrow<E>(sum / T((h1 - h0) * (w1 - w0)));
        }
      }
    }
  });
}

void adaptive_avg_pool2d_backward_cpu(const Tensor& grad_out_any, Tensor& grad_in) {
  check_output_dense("adaptive_avg_pool2d_backward", grad_in);
  const Tensor grad_out = contiguous_input(grad_out_any);
  dispatch_floating_16bit(grad_out.dtype(), "adaptive_avg_pool2d_backward", [&]<typename E>() {
    using T = compute_t<E>;
    const PoolPlanes g = pool_planes_of(grad_in, grad_out);
    const E* gy = grad_out.data_ptr<E>();
    E* gx = grad_in.data_ptr<E>();
    const int64_t area = g.in_h * g.in_w;
    const bool parallel = g.count * area > kPoolGrain && g.count > 1;
    if (g.out_h == 1 && g.out_w == 1) {
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t plane = 0; plane < g.count; ++plane) {
        const E share = narrow<E>(widen(gy[plane]) / T(area));
        E* gxp = gx + plane * area;
#pragma omp simd
        for (int64_t i = 0; i < area; ++i) gxp[i] = share;
      }
      return;
    }
#pragma omp parallel if (parallel)
    {
      PlaneAccumulator<E> acc(area);  // See Note [Pooling gradients accumulate in the compute type]
#pragma omp for schedule(static)
      for (int64_t plane = 0; plane < g.count; ++plane) {
        T* gxp = acc.zeroed(gx + plane * area);
        const E* gyp = gy + plane * g.out_h * g.out_w;
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t h0 = adaptive_begin(oh, g.out_h, g.in_h), h1 = adaptive_end(oh, g.out_h, g.in_h);
          for (int64_t ow = 0; ow < g.out_w; ++ow) {
            const int64_t w0 = adaptive_begin(ow, g.out_w, g.in_w), w1 = adaptive_end(ow, g.out_w, g.in_w);
            // Windows overlap when the size does not divide evenly: accumulate.
            const T share = widen(gyp[oh * g.out_w + ow]) / T((h1 - h0) * (w1 - w0));
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) gxp[h * g.in_w + w] += share;
          }
        }
        acc.store(gx + plane * area);
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
