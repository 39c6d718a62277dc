// CUDA log_softmax (forward, backward) and nll_loss (forward, backward): the GPU twins
// of core/cpu/softmax_loss.cpp.
//
// log_softmax works along the last dim of a contiguous [rows, classes] tensor, one warp
// per row (CIFAR-10 has 10 classes: a block per row would leave most threads idle):
// the row's max and sum of exp(x - max) by warp shuffles, then
//     log_softmax(x)_j = (x_j - max) - log(sum_k exp(x_k - max)),
// computed stably as on the CPU, in float for float and 16-bit floats, double for double.
// CUDA's exp/log differ from glibc's by an ulp or two: results agree with the CPU to
// ~1e-6 relative (float32), not bit for bit.
//
// nll_loss is PyTorch's, as on the CPU: out_i = -weight[t_i] * log_probs[i, t_i], 0 where
// t_i == ignore_index; `sum` adds them, `mean` divides by total_weight (the sum of the
// weights of non-ignored targets), NaN when every target is ignored (0 / 0). Label
// smoothing is composed above (autograd's cross_entropy), not in the kernel. One block
// reduces the whole batch (a loss has one term per sample), accumulating in double as
// the CPU does. Targets that are neither a class nor ignore_index are an error: see
// Note [Index validation on the GPU] (cuda/kernel_utils.cuh).
#include <limits>

#include "core/kernels.h"
#include "cuda/kernel_utils.cuh"  // defines: block_sum, BadIndexFlag, dense, check_dense_output
#include "cuda/loops.cuh"         // defines: dispatch_types, widen, narrow

namespace loom::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kBlockSize / kWarp;

template <typename Acc>
__device__ inline Acc warp_max(Acc v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const Acc other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

template <typename Acc>
__device__ inline Acc warp_sum(Acc v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kBlockSize) log_softmax_rows(const T* x, T* y, int64_t rows, int64_t classes) {
  using Acc = compute_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < rows; r += warps) {
    const T* xr = x + r * classes;
    T* yr = y + r * classes;
    Acc max = -std::numeric_limits<Acc>::infinity();
    for (int64_t j = lane; j < classes; j += kWarp) max = widen(xr[j]) > max ? widen(xr[j]) : max;
    max = warp_max(max);
    Acc sum = Acc(0);
    for (int64_t j = lane; j < classes; j += kWarp) sum += exp(widen(xr[j]) - max);
    const Acc log_sum = log(warp_sum(sum));
    for (int64_t j = lane; j < classes; j += kWarp) yr[j] = narrow<T>((widen(xr[j]) - max) - log_sum);
  }
}

// grad_in_j = grad_out_j - exp(out_j) * sum_k grad_out_k.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    log_softmax_backward_rows(const T* gy, const T* y, T* gx, int64_t rows, int64_t classes) {
  using Acc = compute_t<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < rows; r += warps) {
    const int64_t at = r * classes;
    Acc total = Acc(0);
    for (int64_t j = lane; j < classes; j += kWarp) total += widen(gy[at + j]);
    total = warp_sum(total);
    for (int64_t j = lane; j < classes; j += kWarp) gx[at + j] = narrow<T>(widen(gy[at + j]) - exp(widen(y[at + j])) * total);
  }
}

struct Rows {
  int64_t rows, classes;
};

Rows rows_of(const Tensor& t) {
  const int64_t classes = t.dim() == 0 ? 1 : t.size(t.dim() - 1);
  return {classes == 0 ? 0 : t.numel() / classes, classes};
}

unsigned row_blocks(int64_t rows, int device) {
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(ceil_div(rows, kRowsPerBlock), static_cast<int64_t>(multiprocessor_count(device)) * 32)));
}

void log_softmax_forward_cuda(const Tensor& in_any, Tensor& out) {
  check_dense_output("log_softmax", out);
  const Tensor in = dense(in_any);
  const auto [rows, classes] = rows_of(in);
  if (rows == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);
  dispatch_types(FloatAndHalfTypes{}, in.dtype(), "log_softmax", [&]<typename T>() {
    log_softmax_rows<T><<<row_blocks(rows, device), kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<const T*>(in.raw_data()), static_cast<T*>(out.raw_data()), rows, classes);
    LOOM_CUDA_CHECK_LAUNCH("log_softmax");
  });
}

void log_softmax_backward_cuda(const Tensor& grad_out_any, const Tensor& out_any, Tensor& grad_in) {
  check_dense_output("log_softmax_backward", grad_in);
  const Tensor grad_out = dense(grad_out_any), out = dense(out_any);
  const auto [rows, classes] = rows_of(out);
  if (rows == 0) return;
  const int device = grad_in.device().index;
  DeviceGuard guard(device);
  dispatch_types(FloatAndHalfTypes{}, out.dtype(), "log_softmax_backward", [&]<typename T>() {
    log_softmax_backward_rows<T><<<row_blocks(rows, device), kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<const T*>(grad_out.raw_data()), static_cast<const T*>(out.raw_data()),
        static_cast<T*>(grad_in.raw_data()), rows, classes);
    LOOM_CUDA_CHECK_LAUNCH("log_softmax_backward");
  });
}

// One block: per-sample losses (Reduction::None) or their sum / weighted mean.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    nll_loss_forward_block(const T* lp, const int64_t* target, const T* weight, int64_t n, int64_t classes,
                           Reduction reduction, int64_t ignore_index, T* out, T* total_weight, int64_t* bad) {
  using Acc = compute_t<T>;
  double loss_sum = 0, weight_sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = target[i];
    Acc loss = Acc(0);
    if (t != ignore_index) {
      if (t < 0 || t >= classes) {
        report_bad_index(bad, i);  // the position; the host reads the target itself
      } else {
        const Acc wi = weight ? widen(weight[t]) : Acc(1);
        loss = -wi * widen(lp[i * classes + t]);
        loss_sum += static_cast<double>(loss);
        weight_sum += static_cast<double>(wi);
      }
    }
    if (reduction == Reduction::None) out[i] = narrow<T>(loss);
  }
  loss_sum = block_sum(loss_sum);
  weight_sum = block_sum(weight_sum);
  if (threadIdx.x == 0) {
    total_weight[0] = narrow<T>(static_cast<Acc>(weight_sum));
    if (reduction == Reduction::Sum) out[0] = narrow<T>(static_cast<Acc>(loss_sum));
    if (reduction == Reduction::Mean) out[0] = narrow<T>(static_cast<Acc>(loss_sum / weight_sum));
  }
}

// Only the target column of each row has a gradient; grad_in is zeroed first.
template <typename T>
__global__ void __launch_bounds__(kBlockSize)
    nll_loss_backward_rows(const T* gy, const int64_t* target, const T* weight, int64_t n, int64_t classes,
                           Reduction reduction, int64_t ignore_index, const T* total_weight, T* gx) {
  using Acc = compute_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t t = target[i];
    if (t == ignore_index || t < 0 || t >= classes) continue;  // validated by the forward
    const Acc scale = reduction == Reduction::Mean ? Acc(1) / widen(total_weight[0]) : Acc(1);
    const Acc g = reduction == Reduction::None ? widen(gy[i]) : widen(gy[0]);
    gx[i * classes + t] = narrow<T>(-(weight ? widen(weight[t]) : Acc(1)) * g * scale);
  }
}

void check_nll_inputs(const char* op, const Tensor& target) {
  LOOM_CHECK(target.dtype() == kInt64, op, ": expected int64 class indices as target, got ", target.dtype());
}

void nll_loss_forward_cuda(const Tensor& log_probs_any, const Tensor& target_any, const Tensor& weight_any,
                           Reduction reduction, int64_t ignore_index, Tensor& out, Tensor& total_weight) {
  check_dense_output("nll_loss", out);
  check_nll_inputs("nll_loss", target_any);
  const Tensor log_probs = dense(log_probs_any), target = dense(target_any), weight = dense(weight_any);
  const int64_t n = log_probs.size(0), classes = log_probs.size(1);
  const int device = out.device().index;
  DeviceGuard guard(device);
  BadIndexFlag bad(device);
  dispatch_types(FloatAndHalfTypes{}, log_probs.dtype(), "nll_loss", [&]<typename T>() {
    nll_loss_forward_block<T><<<1, kBlockSize, 0, current_stream(device).handle>>>(
        static_cast<const T*>(log_probs.raw_data()), target.data_ptr<int64_t>(), optional_data<T>(weight), n, classes,
        reduction, ignore_index, static_cast<T*>(out.raw_data()), static_cast<T*>(total_weight.raw_data()), bad.ptr);
    LOOM_CUDA_CHECK_LAUNCH("nll_loss");
  });
  const auto [seen, position] = bad.read(device);
  if (seen) {
    // The CPU's message; the offending target is read back only on this error path.
    const int64_t value = target.select(0, position).item<int64_t>();
    LOOM_FAIL("nll_loss: target ", value, " at position ", position, " is out of bounds: expected a class index in [0, ",
              classes, ") for ", classes, " classes, or ignore_index (", ignore_index, ")");
  }
}

void nll_loss_backward_cuda(const Tensor& grad_out_any, const Tensor& target_any, const Tensor& weight_any,
                            Reduction reduction, int64_t ignore_index, const Tensor& total_weight_any, Tensor& grad_in) {
  check_dense_output("nll_loss_backward", grad_in);
  check_nll_inputs("nll_loss_backward", target_any);
  const Tensor grad_out = dense(grad_out_any), target = dense(target_any), weight = dense(weight_any);
  const Tensor total_weight = dense(total_weight_any);
  const int64_t n = grad_in.size(0), classes = grad_in.size(1);
  if (grad_in.numel() == 0) return;
  const int device = grad_in.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device).handle;
  LOOM_CUDA_CHECK(cudaMemsetAsync(grad_in.raw_data(), 0, grad_in.numel() * element_size(grad_in.dtype()), stream),
                  "zeroing nll_loss's input gradient ", grad_in.shape());
  dispatch_types(FloatAndHalfTypes{}, grad_in.dtype(), "nll_loss_backward", [&]<typename T>() {
    nll_loss_backward_rows<T><<<grid_size(n, device), kBlockSize, 0, stream>>>(
        static_cast<const T*>(grad_out.raw_data()), target.data_ptr<int64_t>(), optional_data<T>(weight), n, classes,
        reduction, ignore_index, static_cast<const T*>(total_weight.raw_data()), static_cast<T*>(grad_in.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH("nll_loss_backward");
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(log_softmax_forward_kernel, DeviceType::CUDA, log_softmax_forward_cuda);
LOOM_REGISTER_KERNEL(log_softmax_backward_kernel, DeviceType::CUDA, log_softmax_backward_cuda);
LOOM_REGISTER_KERNEL(nll_loss_forward_kernel, DeviceType::CUDA, nll_loss_forward_cuda);
LOOM_REGISTER_KERNEL(nll_loss_backward_kernel, DeviceType::CUDA, nll_loss_backward_cuda);

}  // namespace loom::cuda
