// conv2d_forward_kernel and conv2d_backward_kernel on CUDA, through cuDNN.
//
// cuDNN's "legacy" convolution API (cudnnConvolutionForward & co.) is used: deprecated
// in cuDNN 9 in favour of the graph API, but still shipped, and a tenth of the code for
// the same kernels. Bias is added with cudnnAddTensor and its gradient taken with
// cudnnConvolutionBackwardBias.
//
// Note [cuDNN algorithm cache]
// cuDNN has several algorithms per direction (implicit GEMM, FFT, Winograd, ...), with
// different speed and workspace needs per shape. Asking its heuristics costs more than
// a small convolution, and a training step repeats the same few shapes, so the choice
// is cached per (direction, device, dtype, math mode, input/weight shape, stride,
// padding, dilation, groups). The first candidate whose workspace can be allocated wins
// (PyTorch's torch.backends.cudnn.benchmark = False). The workspace is an ordinary
// tensor from the caching allocator: freed after the call, it is reused by the next
// op on the same stream (Note [Allocator streams]), so steady state allocates nothing.
#include <cudnn.h>  // defines: cudnnConvolutionForward, cudnnGetConvolutionForwardAlgorithm_v7, ...

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "core/kernels.h"
#include "cuda/backends.h"     // declares: set_cudnn_allow_tf32
#include "cuda/check.h"        // defines: LOOM_CUDNN_CHECK
#include "cuda/copy.h"         // defines: contiguous_on_device
#include "cuda/device.h"       // defines: DeviceGuard, current_stream
#include "cuda/handle_pool.h"  // defines: HandlePool, HandleLease

namespace loom::cuda {
namespace {

std::atomic<bool> g_cudnn_allow_tf32{true};

HandlePool<cudnnHandle_t>& cudnn_handles() {
  static auto* pool = new HandlePool<cudnnHandle_t>([](int device) {  // leaked: see cuda/handle_pool.h
    cudnnHandle_t handle = nullptr;
    LOOM_CUDNN_CHECK(cudnnCreate(&handle), "creating a cuDNN handle on cuda:", device);
    return handle;
  });
  return *pool;
}

cudnnDataType_t cudnn_type(DType dtype) {
  switch (dtype) {
    case kFloat32: return CUDNN_DATA_FLOAT;
    case kFloat64: return CUDNN_DATA_DOUBLE;
    case kFloat16: return CUDNN_DATA_HALF;
    case kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: LOOM_FAIL("conv2d on CUDA: dtype ", dtype, " is not supported (float32, float64, float16, bfloat16)");
  }
}

// As PyTorch: FMA only for float32 without TF32; tensor cores for 16-bit types.
cudnnMathType_t math_type(DType dtype) {
  if (dtype == kFloat16 || dtype == kBFloat16) return CUDNN_TENSOR_OP_MATH;
  if (dtype == kFloat32 && !g_cudnn_allow_tf32.load(std::memory_order_relaxed)) return CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

// alpha = 1 and beta = 0 or 1, in the scaling type cuDNN wants for the data type.
struct Scale {
  double d;
  float f;
  explicit Scale(double value) : d(value), f(static_cast<float>(value)) {}
  const void* get(DType dtype) const { return dtype == kFloat64 ? static_cast<const void*>(&d) : &f; }
};

int narrow_int(int64_t value) {
  LOOM_CHECK(value >= 0 && value <= INT32_MAX, "conv2d on CUDA: size ", value, " exceeds cuDNN's 32-bit limit");
  return static_cast<int>(value);
}

// The descriptors of one convolution: x [N, C, H, W], w [O, C/groups, kH, kW], y.
// Tensors are described with their strides; weights must be contiguous (OIHW).
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  ConvDescriptors() {
    LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    LOOM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    LOOM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
  }

  // (Separate from the constructor so that a throw here still destroys the descriptors.)
  void set(const Tensor& input, const Tensor& weight, const Tensor& output, const Conv2dParams& p) {
    const DType dtype = input.dtype();
    set_tensor(x, input);
    set_tensor(y, output);
    LOOM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, cudnn_type(dtype), CUDNN_TENSOR_NCHW, narrow_int(weight.size(0)),
                                                narrow_int(weight.size(1)), narrow_int(weight.size(2)),
                                                narrow_int(weight.size(3))),
                     "describing conv2d weight ", weight.shape());
    const cudnnDataType_t compute = dtype == kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    LOOM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, narrow_int(p.padding[0]), narrow_int(p.padding[1]),
                                                     narrow_int(p.stride[0]), narrow_int(p.stride[1]),
                                                     narrow_int(p.dilation[0]), narrow_int(p.dilation[1]),
                                                     CUDNN_CROSS_CORRELATION, compute),
                     "describing conv2d stride/padding/dilation");
    LOOM_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, narrow_int(p.groups)), "setting conv2d groups = ", p.groups);
    LOOM_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math_type(dtype)));
  }
  ~ConvDescriptors() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;

  static void set_tensor(cudnnTensorDescriptor_t desc, const Tensor& t) {
    LOOM_CHECK(t.dim() == 4, "conv2d on CUDA: expected a 4-d NCHW tensor, got shape ", t.shape());
    LOOM_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(desc, cudnn_type(t.dtype()), narrow_int(t.size(0)), narrow_int(t.size(1)),
                                                  narrow_int(t.size(2)), narrow_int(t.size(3)), narrow_int(t.stride(0)),
                                                  narrow_int(t.stride(1)), narrow_int(t.stride(2)),
                                                  narrow_int(t.stride(3))),
                     "describing conv2d tensor ", t.shape());
  }
};

// ---- algorithm choice: see Note [cuDNN algorithm cache] ------------------------------------

enum class Direction { Forward = 0, BackwardData = 1, BackwardFilter = 2 };

// Per direction: the perf struct cuDNN's heuristics fill, and the calls that fill it.
template <Direction D> struct Algorithms;
template <> struct Algorithms<Direction::Forward> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static cudnnStatus_t rank(cudnnHandle_t h, const ConvDescriptors& d, int* n, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, kCount, n, perf);
  }
};
template <> struct Algorithms<Direction::BackwardData> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static cudnnStatus_t rank(cudnnHandle_t h, const ConvDescriptors& d, int* n, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kCount, n, perf);
  }
};
template <> struct Algorithms<Direction::BackwardFilter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static constexpr int kCount = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static cudnnStatus_t rank(cudnnHandle_t h, const ConvDescriptors& d, int* n, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, kCount, n, perf);
  }
};

using ConvKey = std::array<int64_t, 19>;
struct Choice {
  int algo;
  size_t workspace_bytes;
  cudnnMathType_t math;  // the math type cuDNN ranked the algorithm with
};

ConvKey make_key(Direction direction, const Tensor& input, const Tensor& weight, const Conv2dParams& p) {
  return {static_cast<int64_t>(direction), input.device().index, static_cast<int64_t>(input.dtype()),
          static_cast<int64_t>(math_type(input.dtype())), input.size(0), input.size(1), input.size(2), input.size(3),
          weight.size(0), weight.size(1), weight.size(2), weight.size(3), p.stride[0], p.stride[1], p.padding[0],
          p.padding[1], p.dilation[0], p.dilation[1], p.groups};
}

std::mutex g_cache_mutex;
std::map<ConvKey, Choice> g_cache;

// Runs `run(algo, workspace_ptr, workspace_bytes)` with the cached algorithm for `key`,
// or, on a miss, with cuDNN's candidates in rank order until one runs: its workspace
// fits and cuDNN accepts it (a heuristic's candidate may still be refused with
// NOT_SUPPORTED). Each candidate runs with the math type it was ranked with, as
// PyTorch's try_all does; where exact float math was asked for (math_type() said FMA),
// candidates that would round to TF32 are passed over.
template <Direction D, typename Run>
void with_algorithm(cudnnHandle_t handle, const ConvDescriptors& desc, const ConvKey& key, Device device, Run run) {
  std::optional<Choice> cached;
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    if (auto it = g_cache.find(key); it != g_cache.end()) cached = it->second;
  }
  if (cached) {
    LOOM_CUDNN_CHECK(cudnnSetConvolutionMathType(desc.conv, cached->math));
    Tensor workspace = empty({static_cast<int64_t>(cached->workspace_bytes)}, TensorOptions(kUInt8).device(device));
    run(cached->algo, cached->workspace_bytes ? workspace.raw_data() : nullptr, cached->workspace_bytes);
    return;
  }
  const auto wanted_math = static_cast<cudnnMathType_t>(key[3]);
  using A = Algorithms<D>;
  typename A::Perf perf[A::kCount];
  int returned = 0;
  LOOM_CUDNN_CHECK(A::rank(handle, desc, &returned, perf), "ranking cuDNN convolution algorithms");
  std::string tried;
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (wanted_math == CUDNN_FMA_MATH && perf[i].mathType != CUDNN_FMA_MATH) continue;
    Tensor workspace;
    try {
      workspace = empty({static_cast<int64_t>(perf[i].memory)}, TensorOptions(kUInt8).device(device));
    } catch (const Error& e) {  // out of memory for this one: try the next, leaner algorithm
      tried += ::loom::detail::str("\n  algorithm ", static_cast<int>(perf[i].algo), ": ", e.what());
      continue;
    }
    try {
      LOOM_CUDNN_CHECK(cudnnSetConvolutionMathType(desc.conv, perf[i].mathType));
      run(static_cast<int>(perf[i].algo), perf[i].memory ? workspace.raw_data() : nullptr, perf[i].memory);
    } catch (const Error& e) {  // refused by cuDNN: the next candidate
      tried += ::loom::detail::str("\n  algorithm ", static_cast<int>(perf[i].algo), ": ", e.what());
      continue;
    }
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    g_cache.emplace(key, Choice{static_cast<int>(perf[i].algo), perf[i].memory, perf[i].mathType});
    return;
  }
  LOOM_FAIL("conv2d on CUDA: no cuDNN algorithm could run for input ", key[4], "x", key[5], "x", key[6], "x", key[7],
            ", weight ", key[8], "x", key[9], "x", key[10], "x", key[11],
            tried.empty() ? std::string(" (cuDNN offered none for this configuration)") : tried);
}

// ---- kernels ---------------------------------------------------------------------------

void conv2d_forward_cuda(const Tensor& input_, const Tensor& weight_, const Tensor& bias, const Conv2dParams& p,
                         Tensor& out) {
  const int device = out.device().index;
  DeviceGuard guard(device);
  const Tensor input = contiguous_on_device(input_), weight = contiguous_on_device(weight_);
  const DType dtype = input.dtype();
  ConvDescriptors desc;
  desc.set(input, weight, out, p);
  HandleLease<cudnnHandle_t> lease(cudnn_handles(), device);
  LOOM_CUDNN_CHECK(cudnnSetStream(lease.handle, current_stream(device).handle), "binding cuDNN to loom's stream");
  const Scale one(1.0), zero(0.0);
  with_algorithm<Direction::Forward>(lease.handle, desc, make_key(Direction::Forward, input, weight, p), out.device(),
                                     [&](int algo, void* workspace, size_t bytes) {
    LOOM_CUDNN_CHECK(cudnnConvolutionForward(lease.handle, one.get(dtype), desc.x, input.raw_data(), desc.w,
                                             weight.raw_data(), desc.conv, static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                             workspace, bytes, zero.get(dtype), desc.y, out.raw_data()),
                     "conv2d forward of input ", input.shape(), " with weight ", weight.shape());
  });
  if (bias.defined()) {
    Tensor b = contiguous_on_device(bias);
    cudnnTensorDescriptor_t bias_desc = nullptr;
    LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias_desc));
    ConvDescriptors::set_tensor(bias_desc, make_tensor(b.storage(), {1, b.numel(), 1, 1}, {b.numel(), 1, 1, 1},
                                                       b.storage_offset(), b.dtype()));
    cudnnStatus_t status = cudnnAddTensor(lease.handle, one.get(dtype), bias_desc, b.raw_data(), one.get(dtype), desc.y,
                                          out.raw_data());
    cudnnDestroyTensorDescriptor(bias_desc);
    LOOM_CUDNN_CHECK(status, "adding the conv2d bias ", bias.shape());
  }
}

void conv2d_backward_cuda(const Tensor& grad_out_, const Tensor& input_, const Tensor& weight_, const Conv2dParams& p,
                          Tensor& grad_input, Tensor& grad_weight, Tensor& grad_bias) {
  const int device = grad_out_.device().index;
  DeviceGuard guard(device);
  const Tensor grad_out = contiguous_on_device(grad_out_), input = contiguous_on_device(input_),
               weight = contiguous_on_device(weight_);
  const DType dtype = input.dtype();
  ConvDescriptors desc;
  desc.set(input, weight, grad_out, p);
  HandleLease<cudnnHandle_t> lease(cudnn_handles(), device);
  LOOM_CUDNN_CHECK(cudnnSetStream(lease.handle, current_stream(device).handle), "binding cuDNN to loom's stream");
  const Scale one(1.0), zero(0.0);

  if (grad_input.defined()) {
    // grad_input is described by desc.x: it must have input's layout (contiguous).
    Tensor gi = grad_input.is_contiguous() ? grad_input : empty(grad_input.shape(), TensorOptions(dtype).device(grad_input.device()));
    with_algorithm<Direction::BackwardData>(lease.handle, desc, make_key(Direction::BackwardData, input, weight, p),
                                            input.device(), [&](int algo, void* workspace, size_t bytes) {
      LOOM_CUDNN_CHECK(cudnnConvolutionBackwardData(lease.handle, one.get(dtype), desc.w, weight.raw_data(), desc.y,
                                                    grad_out.raw_data(), desc.conv,
                                                    static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), workspace, bytes,
                                                    zero.get(dtype), desc.x, gi.raw_data()),
                       "conv2d backward (input gradient) for input ", input.shape(), ", weight ", weight.shape());
    });
    if (!gi.is_same(grad_input)) copy_on_device(gi, grad_input);
  }
  if (grad_weight.defined()) {
    // A float32 gradient for 16-bit operands (Note [Autocast conv2d weight gradients]) is
    // computed in dtype and widened by copy_on_device.
    Tensor gw = grad_weight.is_contiguous() && grad_weight.dtype() == dtype ? grad_weight : empty(grad_weight.shape(), TensorOptions(dtype).device(grad_weight.device()));
    with_algorithm<Direction::BackwardFilter>(lease.handle, desc, make_key(Direction::BackwardFilter, input, weight, p),
                                              input.device(), [&](int algo, void* workspace, size_t bytes) {
      LOOM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(lease.handle, one.get(dtype), desc.x, input.raw_data(), desc.y,
                                                      grad_out.raw_data(), desc.conv,
                                                      static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), workspace,
                                                      bytes, zero.get(dtype), desc.w, gw.raw_data()),
                       "conv2d backward (weight gradient) for input ", input.shape(), ", weight ", weight.shape());
    });
    if (!gw.is_same(grad_weight)) copy_on_device(gw, grad_weight);
  }
  if (grad_bias.defined()) {
    Tensor gb = grad_bias.is_contiguous() && grad_bias.dtype() == dtype ? grad_bias : empty(grad_bias.shape(), TensorOptions(dtype).device(grad_bias.device()));
    cudnnTensorDescriptor_t bias_desc = nullptr;
    LOOM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias_desc));
    ConvDescriptors::set_tensor(bias_desc, make_tensor(gb.storage(), {1, gb.numel(), 1, 1}, {gb.numel(), 1, 1, 1},
                                                       gb.storage_offset(), gb.dtype()));
    cudnnStatus_t status = cudnnConvolutionBackwardBias(lease.handle, one.get(dtype), desc.y, grad_out.raw_data(),
                                                        zero.get(dtype), bias_desc, gb.raw_data());
    cudnnDestroyTensorDescriptor(bias_desc);
    LOOM_CUDNN_CHECK(status, "conv2d backward (bias gradient) for grad_out ", grad_out.shape());
    if (!gb.is_same(grad_bias)) copy_on_device(gb, grad_bias);
  }
}

}  // namespace

void set_cudnn_allow_tf32(bool allow) { g_cudnn_allow_tf32.store(allow, std::memory_order_relaxed); }
bool cudnn_allow_tf32() { return g_cudnn_allow_tf32.load(std::memory_order_relaxed); }

LOOM_REGISTER_KERNEL(conv2d_forward_kernel, DeviceType::CUDA, conv2d_forward_cuda);
LOOM_REGISTER_KERNEL(conv2d_backward_kernel, DeviceType::CUDA, conv2d_backward_cuda);

}  // namespace loom::cuda
