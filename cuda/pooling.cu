// CUDA pooling kernels: max_pool2d, avg_pool2d, adaptive_avg_pool2d, forward and
// backward -- the GPU twins of core/cpu/pooling.cpp, with the same window arithmetic
// (PyTorch's), so the values, the argmax chosen on ties and NaN propagation agree.
//
// Inputs are viewed as planes ([N, C, H, W] = N*C independent H x W images), made dense
// first if they are strided views.
// - Forward: one thread per output element walks its window, in the CPU's (h, w) order
//   and in the same arithmetic type (float for 16-bit floats), so results are identical.
//
// Note [Pooling backward as a gather]
// The CPU backward scatters: each output adds its gradient to the inputs of its window,
// output by output. On the GPU that would need atomics wherever windows overlap. Instead
// one thread per *input* element gathers from the outputs whose windows contain it, in
// increasing (oh, ow) order -- the order in which the CPU's scatter reaches that element
// -- so each element receives the same additions in the same order: no atomics, results
// bit-identical to the CPU and deterministic. That needs the window's shape, which
// avg_pool2d's and adaptive_avg_pool2d's backward kernels are given.
// max_pool2d's backward gets only the saved argmax indices (core/kernels.h), so it
// scatters: one thread per output adds its gradient to its argmax with atomicAdd. Where
// windows do not overlap (stride >= kernel, the common case) each input gets at most one
// addition and the result equals the CPU's; with overlap the order of the additions,
// and so the last bits of a float sum, may vary between runs (as PyTorch's CUDA kernel).
#include <cmath>
#include <limits>

#include "core/kernels.h"
#include "core/pooling_geometry.h"  // defines: PoolPlanes, pool_planes_of, first_inside
#include "cuda/kernel_utils.cuh"  // defines: dense, check_dense_output
#include "cuda/loops.cuh"         // defines: dispatch_types, widen, narrow, grid_size

namespace loom::cuda {
namespace {

// Pool2dParams as plain values a kernel can take by value.
struct Window {
  int kh, kw, sh, sw, ph, pw, dh, dw;
  bool count_include_pad;
};

Window window_of(const Pool2dParams& p) {
  return {static_cast<int>(p.kernel[0]), static_cast<int>(p.kernel[1]), static_cast<int>(p.stride[0]),
          static_cast<int>(p.stride[1]), static_cast<int>(p.padding[0]), static_cast<int>(p.padding[1]),
          static_cast<int>(p.dilation[0]), static_cast<int>(p.dilation[1]), p.count_include_pad};
}


#define LOOM_GRID_STRIDE_LOOP(i, n)                                                                    \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);             \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    max_pool_forward(PoolPlanes g, Window k, const T* x, T* y, int64_t* arg) {
  using Acc = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(o, g.count * g.out_h * g.out_w) {
    const int64_t plane = o / (g.out_h * g.out_w), oh = o / g.out_w % g.out_h, ow = o % g.out_w;
    const T* xp = x + plane * g.in_h * g.in_w;
    const int64_t h_end = min(oh * k.sh - k.ph + (k.kh - 1) * k.dh + 1, g.in_h);
    const int64_t h_begin = first_inside(oh * k.sh - k.ph, k.dh);
    const int64_t w_end = min(ow * k.sw - k.pw + (k.kw - 1) * k.dw + 1, g.in_w);
    const int64_t w_begin = first_inside(ow * k.sw - k.pw, k.dw);
    Acc best = -std::numeric_limits<Acc>::infinity();
    int64_t best_index = h_begin * g.in_w + w_begin;
    for (int64_t h = h_begin; h < h_end; h += k.dh) {
      for (int64_t w = w_begin; w < w_end; w += k.dw) {
        const Acc v = widen(xp[h * g.in_w + w]);
        if (v > best || v != v) {  // the first strict maximum; a NaN always wins
          best = v;
          best_index = h * g.in_w + w;
        }
      }
    }
    y[o] = narrow<T>(best);
    arg[o] = best_index;
  }
}

// The outputs along one axis whose windows may contain input position `i` (before
// checking), as PyTorch's CUDA kernels: [begin, end).
__device__ inline void outputs_touching(int64_t i, int64_t pad, int64_t kernel_extent, int64_t stride, int64_t out,
                                        int64_t& begin, int64_t& end) {
  begin = i + pad < kernel_extent ? 0 : (i + pad - kernel_extent) / stride + 1;
  end = min((i + pad) / stride + 1, out);
}

// See Note [Pooling backward as a gather]: max pooling scatters, into a zeroed grad_in.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    max_pool_backward(PoolPlanes g, const T* gy, const int64_t* arg, T* gx) {
  const int64_t in_plane = g.in_h * g.in_w, out_plane = g.out_h * g.out_w;
  LOOM_GRID_STRIDE_LOOP(o, g.count * out_plane) {
    const int64_t a = arg[o];
    if (a >= 0 && a < in_plane) atomicAdd(gx + (o / out_plane) * in_plane + a, gy[o]);  // as the CPU's bounds check
  }
}

// avg_pool2d's window for output (oh, ow): the summed box and its divisor (CPU: avg_window).
struct AvgWindow {
  int64_t h_begin, h_end, w_begin, w_end, divisor;
};

__device__ inline AvgWindow avg_window(const Window& k, const PoolPlanes& g, int64_t oh, int64_t ow) {
  int64_t h0 = oh * k.sh - k.ph, w0 = ow * k.sw - k.pw;
  int64_t h1 = min(h0 + k.kh, g.in_h + k.ph);
  int64_t w1 = min(w0 + k.kw, g.in_w + k.pw);
  const int64_t padded_area = (h1 - h0) * (w1 - w0);
  h0 = max(h0, int64_t{0});
  w0 = max(w0, int64_t{0});
  h1 = min(h1, g.in_h);
  w1 = min(w1, g.in_w);
  return {h0, h1, w0, w1, k.count_include_pad ? padded_area : (h1 - h0) * (w1 - w0)};
}

template <typename T>
__global__ void __launch_bounds__(kBlockSize) avg_pool_forward(PoolPlanes g, Window k, const T* x, T* y) {
  using Acc = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(o, g.count * g.out_h * g.out_w) {
    const int64_t plane = o / (g.out_h * g.out_w), oh = o / g.out_w % g.out_h, ow = o % g.out_w;
    const T* xp = x + plane * g.in_h * g.in_w;
    const AvgWindow win = avg_window(k, g, oh, ow);
    Acc sum = Acc(0);
    for (int64_t h = win.h_begin; h < win.h_end; ++h)
      for (int64_t w = win.w_begin; w < win.w_end; ++w) sum += widen(xp[h * g.in_w + w]);
    // An empty window (only possible when it lies wholly in the padding) is 0, as the CPU.
    y[o] = narrow<T>(win.h_begin < win.h_end && win.w_begin < win.w_end ? sum / static_cast<Acc>(win.divisor) : Acc(0));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockSize) avg_pool_backward(PoolPlanes g, Window k, const T* gy, T* gx) {
  using Acc = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(i, g.count * g.in_h * g.in_w) {
    const int64_t plane = i / (g.in_h * g.in_w), h = i / g.in_w % g.in_h, w = i % g.in_w;
    int64_t oh0, oh1, ow0, ow1;  // See Note [Pooling backward as a gather].
    outputs_touching(h, k.ph, k.kh, k.sh, g.out_h, oh0, oh1);
    outputs_touching(w, k.pw, k.kw, k.sw, g.out_w, ow0, ow1);
    const T* gyp = gy + plane * g.out_h * g.out_w;
    Acc sum = Acc(0);
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const AvgWindow win = avg_window(k, g, oh, ow);
        if (h < win.h_begin || h >= win.h_end || w < win.w_begin || w >= win.w_end) continue;
        sum += widen(gyp[oh * g.out_w + ow]) / static_cast<Acc>(win.divisor);
      }
    }
    gx[i] = narrow<T>(sum);
  }
}

// PyTorch's adaptive window bounds: [floor(i*size/out), ceil((i+1)*size/out)).
__device__ inline int64_t adaptive_begin(int64_t i, int64_t out, int64_t size) { return (i * size) / out; }
__device__ inline int64_t adaptive_end(int64_t i, int64_t out, int64_t size) { return ((i + 1) * size + out - 1) / out; }

template <typename T>
__global__ void __launch_bounds__(kBlockSize) adaptive_avg_forward(PoolPlanes g, const T* x, T* y) {
  using Acc = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(o, g.count * g.out_h * g.out_w) {
    const int64_t plane = o / (g.out_h * g.out_w), oh = o / g.out_w % g.out_h, ow = o % g.out_w;
    const T* xp = x + plane * g.in_h * g.in_w;
    const int64_t h0 = adaptive_begin(oh, g.out_h, g.in_h), h1 = adaptive_end(oh, g.out_h, g.in_h);
    const int64_t w0 = adaptive_begin(ow, g.out_w, g.in_w), w1 = adaptive_end(ow, g.out_w, g.in_w);
    Acc sum = Acc(0);
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) sum += widen(xp[h * g.in_w + w]);
    y[o] = narrow<T>(sum / static_cast<Acc>((h1 - h0) * (w1 - w0)));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockSize) adaptive_avg_backward(PoolPlanes g, const T* gy, T* gx) {
  using Acc = compute_t<T>;
  LOOM_GRID_STRIDE_LOOP(i, g.count * g.in_h * g.in_w) {
    const int64_t plane = i / (g.in_h * g.in_w), h = i / g.in_w % g.in_h, w = i % g.in_w;
    const T* gyp = gy + plane * g.out_h * g.out_w;
    // Outputs whose window contains h: oh in [floor(h*OH/H), ceil((h+1)*OH/H)), checked.
    const int64_t oh0 = h * g.out_h / g.in_h, oh1 = min(((h + 1) * g.out_h + g.in_h - 1) / g.in_h, g.out_h);
    const int64_t ow0 = w * g.out_w / g.in_w, ow1 = min(((w + 1) * g.out_w + g.in_w - 1) / g.in_w, g.out_w);
    Acc sum = Acc(0);
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t h0 = adaptive_begin(oh, g.out_h, g.in_h), h1 = adaptive_end(oh, g.out_h, g.in_h);
      if (h < h0 || h >= h1) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t w0 = adaptive_begin(ow, g.out_w, g.in_w), w1 = adaptive_end(ow, g.out_w, g.in_w);
        if (w < w0 || w >= w1) continue;
        sum += widen(gyp[oh * g.out_w + ow]) / static_cast<Acc>((h1 - h0) * (w1 - w0));
      }
    }
    gx[i] = narrow<T>(sum);
  }
}

// Launches `kernel` over `n` threads on the device of `t`, in its current stream.
template <typename Kernel, typename... Args>
void launch(const char* op, const Tensor& t, int64_t n, Kernel kernel, Args... args) {
  if (n == 0) return;
  const int device = t.device().index;
  DeviceGuard guard(device);
  kernel<<<grid_size(n, device), kBlockSize, 0, current_stream(device).handle>>>(args...);
  LOOM_CUDA_CHECK_LAUNCH(op);
}

void max_pool2d_forward_cuda(const Tensor& in_any, const Pool2dParams& p, Tensor& out, Tensor& indices) {
  check_dense_output("max_pool2d", out);
  check_dense_output("max_pool2d", indices);
  const Tensor in = dense(in_any);
  const PoolPlanes g = pool_planes_of(in, out);
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "max_pool2d", [&]<typename T>() {
    launch("max_pool2d", out, out.numel(), max_pool_forward<T>, g, window_of(p), static_cast<const T*>(in.raw_data()),
           static_cast<T*>(out.raw_data()), indices.data_ptr<int64_t>());
  });
}

void max_pool2d_backward_cuda(const Tensor& grad_out_any, const Tensor& indices_any, Tensor& grad_in) {
  check_dense_output("max_pool2d_backward", grad_in);
  const Tensor grad_out = dense(grad_out_any);
  const Tensor indices = dense(indices_any);
  const PoolPlanes g = pool_planes_of(grad_in, grad_out);
  if (grad_in.numel() == 0) return;
  const int device = grad_in.device().index;
  DeviceGuard guard(device);
  LOOM_CUDA_CHECK(cudaMemsetAsync(grad_in.raw_data(), 0, grad_in.numel() * element_size(grad_in.dtype()),
                                  current_stream(device).handle),
                  "zeroing max_pool2d's input gradient ", grad_in.shape());
  dispatch_types(FloatAndHalfTypes{}, grad_out.dtype(), "max_pool2d_backward", [&]<typename T>() {
    launch("max_pool2d_backward", grad_in, grad_out.numel(), max_pool_backward<T>, g,
           static_cast<const T*>(grad_out.raw_data()), indices.data_ptr<int64_t>(), static_cast<T*>(grad_in.raw_data()));
  });
}

void avg_pool2d_forward_cuda(const Tensor& in_any, const Pool2dParams& p, Tensor& out) {
  check_dense_output("avg_pool2d", out);
  const Tensor in = dense(in_any);
  const PoolPlanes g = pool_planes_of(in, out);
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "avg_pool2d", [&]<typename T>() {
    launch("avg_pool2d", out, out.numel(), avg_pool_forward<T>, g, window_of(p), static_cast<const T*>(in.raw_data()),
           static_cast<T*>(out.raw_data()));
  });
}

void avg_pool2d_backward_cuda(const Tensor& grad_out_any, const Pool2dParams& p, Tensor& grad_in) {
  check_dense_output("avg_pool2d_backward", grad_in);
  const Tensor grad_out = dense(grad_out_any);
  const PoolPlanes g = pool_planes_of(grad_in, grad_out);
  dispatch_types(FloatAndHalfTypes{}, grad_out.dtype(), "avg_pool2d_backward", [&]<typename T>() {
    launch("avg_pool2d_backward", grad_in, grad_in.numel(), avg_pool_backward<T>, g, window_of(p),
           static_cast<const T*>(grad_out.raw_data()), static_cast<T*>(grad_in.raw_data()));
  });
}

void adaptive_avg_pool2d_forward_cuda(const Tensor& in_any, Tensor& out) {
  check_dense_output("adaptive_avg_pool2d", out);
  const Tensor in = dense(in_any);
  const PoolPlanes g = pool_planes_of(in, out);
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "adaptive_avg_pool2d", [&]<typename T>() {
    launch("adaptive_avg_pool2d", out, out.numel(), adaptive_avg_forward<T>, g, static_cast<const T*>(in.raw_data()),
           static_cast<T*>(out.raw_data()));
  });
}

void adaptive_avg_pool2d_backward_cuda(const Tensor& grad_out_any, Tensor& grad_in) {
  check_dense_output("adaptive_avg_pool2d_backward", grad_in);
  const Tensor grad_out = dense(grad_out_any);
  const PoolPlanes g = pool_planes_of(grad_in, grad_out);
  dispatch_types(FloatAndHalfTypes{}, grad_out.dtype(), "adaptive_avg_pool2d_backward", [&]<typename T>() {
    launch("adaptive_avg_pool2d_backward", grad_in, grad_in.numel(), adaptive_avg_backward<T>, g,
           static_cast<const T*>(grad_out.raw_data()), static_cast<T*>(grad_in.raw_data()));
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(max_pool2d_forward_kernel, DeviceType::CUDA, max_pool2d_forward_cuda);
LOOM_REGISTER_KERNEL(max_pool2d_backward_kernel, DeviceType::CUDA, max_pool2d_backward_cuda);
LOOM_REGISTER_KERNEL(avg_pool2d_forward_kernel, DeviceType::CUDA, avg_pool2d_forward_cuda);
LOOM_REGISTER_KERNEL(avg_pool2d_backward_kernel, DeviceType::CUDA, avg_pool2d_backward_cuda);
LOOM_REGISTER_KERNEL(adaptive_avg_pool2d_forward_kernel, DeviceType::CUDA, adaptive_avg_pool2d_forward_cuda);
LOOM_REGISTER_KERNEL(adaptive_avg_pool2d_backward_kernel, DeviceType::CUDA, adaptive_avg_pool2d_backward_cuda);

}  // namespace loom::cuda
