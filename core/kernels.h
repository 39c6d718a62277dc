// The backend interface: every kernel a device backend provides, as dispatch stubs.
//
// Conventions shared by all kernels here:
// - `out` (and every output) is allocated by the caller with the right shape, dtype and
//   device; kernels only fill it. Inputs are on the same device as outputs.
// - Elementwise inputs are already broadcast to the output's shape (expand()ed views,
//   stride 0 where broadcast), so a kernel never reasons about broadcasting.
// - Inputs may be arbitrary strided views unless a comment says "contiguous".
// - Differentiation lives above (autograd/ops/*): kernels are plain math.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dispatch.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/tensor.h"

namespace loom {

// ---- elementwise ----------------------------------------------------------------------
enum class UnaryOp { Neg, Exp, Log, Sqrt, Rsqrt, Abs, Relu, Sigmoid, Tanh };
enum class BinaryOp {
  Add, Sub, Mul, Div, Maximum, Minimum,  // out dtype = input dtype; Add/Sub use alpha
  Eq, Ne, Lt, Le, Gt, Ge                 // out dtype = bool
};

LOOM_DECLARE_KERNEL(unary_kernel, void (*)(UnaryOp op, const Tensor& in, Tensor& out));
// out = a (op) alpha * b for Add/Sub; alpha is ignored by the other ops.
LOOM_DECLARE_KERNEL(binary_kernel, void (*)(BinaryOp op, const Tensor& a, const Tensor& b, double alpha, Tensor& out));
LOOM_DECLARE_KERNEL(pow_scalar_kernel, void (*)(const Tensor& in, double exponent, Tensor& out));
LOOM_DECLARE_KERNEL(clamp_kernel, void (*)(const Tensor& in, double min, double max, Tensor& out));
// out = cond ? a : b; cond is bool.
LOOM_DECLARE_KERNEL(where_kernel, void (*)(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out));
// grad_in = out_or_in > threshold ? grad_out : 0 (ReLU's backward, fused for speed).
LOOM_DECLARE_KERNEL(threshold_backward_kernel, void (*)(const Tensor& grad_out, const Tensor& out_or_in, double threshold, Tensor& grad_in));
LOOM_DECLARE_KERNEL(fill_kernel, void (*)(Tensor& self, double value));
// dst = src with dtype conversion; same device kind (cross-device copies: core/copy.cpp).
LOOM_DECLARE_KERNEL(copy_kernel, void (*)(const Tensor& src, Tensor& dst, bool non_blocking));

// ---- random (see Note [Counter-based randomness]) ---------------------------------------
LOOM_DECLARE_KERNEL(uniform_kernel, void (*)(Tensor& self, double low, double high, Generator& gen));
LOOM_DECLARE_KERNEL(normal_kernel, void (*)(Tensor& self, double mean, double std, Generator& gen));
// Integers in [low, high).
LOOM_DECLARE_KERNEL(randint_kernel, void (*)(Tensor& self, int64_t low, int64_t high, Generator& gen));

// ---- reductions -------------------------------------------------------------------------
enum class ReduceOp { Sum, Mean, Max, Min };
// `dims` sorted, unique, non-empty; out has the keepdim shape (reduced dims of size 1).
LOOM_DECLARE_KERNEL(reduce_kernel, void (*)(ReduceOp op, const Tensor& in, const std::vector<int64_t>& dims, Tensor& out));
// Max or min along one dim with the index of the first extreme; keepdim-shaped outputs.
LOOM_DECLARE_KERNEL(max_min_dim_kernel, void (*)(bool is_max, const Tensor& in, int64_t dim, Tensor& values, Tensor& indices));

// ---- mixed precision (nn/optim/grad_scaler.h) ---------------------------------------------
// grad *= inv_scale in place, and found_inf (a one-element float32 tensor on grad's
// device) is set to 1 if any element of grad was inf or NaN before scaling; it is never
// reset to 0, so one found_inf collects the verdict over many gradients (the caller
// zero-fills it first), as torch._amp_foreach_non_finite_check_and_unscale_. grad is
// contiguous (strides of a broadcast view would make the in-place update race).
LOOM_DECLARE_KERNEL(non_finite_check_and_unscale_kernel, void (*)(Tensor& grad, Tensor& found_inf, double inv_scale));
// What every backend's non_finite_check_and_unscale checks before it touches memory.
inline void check_unscale_arguments(const Tensor& grad, const Tensor& found_inf) {
  LOOM_CHECK(grad.is_contiguous(), "non_finite_check_and_unscale: expected a contiguous gradient, got strides ",
             grad.strides(), " for shape ", grad.shape());
  LOOM_CHECK(found_inf.dtype() == kFloat32 && found_inf.numel() == 1 && found_inf.device() == grad.device(),
             "non_finite_check_and_unscale: expected found_inf as a one-element float32 tensor on ", grad.device(),
             ", got ", found_inf.str());
}

// ---- linear algebra ---------------------------------------------------------------------
// out[M,N] = beta * out + a[M,K] @ b[K,N]; a and b may be transposed views (either
// unit stride in one dim); beta is 0 or 1.
LOOM_DECLARE_KERNEL(mm_kernel, void (*)(const Tensor& a, const Tensor& b, double beta, Tensor& out));
// out[B,M,N] = a[B,M,K] @ b[B,K,N].
LOOM_DECLARE_KERNEL(bmm_kernel, void (*)(const Tensor& a, const Tensor& b, Tensor& out));

// ---- indexing ---------------------------------------------------------------------------
LOOM_DECLARE_KERNEL(index_select_kernel, void (*)(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out));
// out.index_select(dim, index) += src (out pre-zeroed by the caller when needed).
LOOM_DECLARE_KERNEL(index_add_kernel, void (*)(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src));
LOOM_DECLARE_KERNEL(gather_kernel, void (*)(const Tensor& in, int64_t dim, const Tensor& index, Tensor& out));
LOOM_DECLARE_KERNEL(scatter_add_kernel, void (*)(Tensor& out, int64_t dim, const Tensor& index, const Tensor& src));

// ---- neural-network kernels --------------------------------------------------------------
struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};
// NCHW input, OIHW weight (contiguous); bias may be undefined.
LOOM_DECLARE_KERNEL(conv2d_forward_kernel, void (*)(const Tensor& input, const Tensor& weight, const Tensor& bias,
                                                    const Conv2dParams& params, Tensor& out));
// Fills whichever of grad_input / grad_weight / grad_bias are defined.
LOOM_DECLARE_KERNEL(conv2d_backward_kernel, void (*)(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                                                     const Conv2dParams& params, Tensor& grad_input,
                                                     Tensor& grad_weight, Tensor& grad_bias));

struct Pool2dParams {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg pooling only
};
// indices (int64) holds the flat h*W+w argmax per output, as PyTorch's.
LOOM_DECLARE_KERNEL(max_pool2d_forward_kernel, void (*)(const Tensor& in, const Pool2dParams& p, Tensor& out, Tensor& indices));
LOOM_DECLARE_KERNEL(max_pool2d_backward_kernel, void (*)(const Tensor& grad_out, const Tensor& indices, Tensor& grad_in));
LOOM_DECLARE_KERNEL(avg_pool2d_forward_kernel, void (*)(const Tensor& in, const Pool2dParams& p, Tensor& out));
LOOM_DECLARE_KERNEL(avg_pool2d_backward_kernel, void (*)(const Tensor& grad_out, const Pool2dParams& p, Tensor& grad_in));
LOOM_DECLARE_KERNEL(adaptive_avg_pool2d_forward_kernel, void (*)(const Tensor& in, Tensor& out));
LOOM_DECLARE_KERNEL(adaptive_avg_pool2d_backward_kernel, void (*)(const Tensor& grad_out, Tensor& grad_in));

// Training: normalise with batch statistics, write save_mean / save_invstd (per channel)
// and, if running_mean is defined, update running stats (unbiased variance), in place.
// Eval: normalise with running stats, and write the statistics used into save_mean /
// save_invstd so that the backward never reads the running buffers (every backend must).
// weight/bias may be undefined (affine=false).
// The epilogue (Note [Fused BatchNorm epilogue] in autograd/ops/nn.cpp, cuDNN's
// BN_ADD_ACTIVATION): out = bn(in) + residual, then max(0, .) when `relu`; residual may be
// undefined (nothing added).
LOOM_DECLARE_KERNEL(batch_norm_forward_kernel,
                    void (*)(const Tensor& in, const Tensor& weight, const Tensor& bias, Tensor& running_mean,
                             Tensor& running_var, bool training, double momentum, double eps,
                             const Tensor& residual, bool relu, Tensor& out, Tensor& save_mean, Tensor& save_invstd));
// relu_out: the forward's `out` if it ran with relu (else undefined); grad_out is then the
// gradient of that output and is first masked where relu_out <= 0, as ReLU's backward.
// grad_residual, if defined, receives the (masked) gradient of the residual.
LOOM_DECLARE_KERNEL(batch_norm_backward_kernel,
                    void (*)(const Tensor& grad_out, const Tensor& in, const Tensor& weight, const Tensor& save_mean,
                             const Tensor& save_invstd, bool training, const Tensor& relu_out, Tensor& grad_in,
                             Tensor& grad_weight, Tensor& grad_bias, Tensor& grad_residual));

// Along the last dim of a contiguous [rows, classes] tensor.
LOOM_DECLARE_KERNEL(log_softmax_forward_kernel, void (*)(const Tensor& in, Tensor& out));
LOOM_DECLARE_KERNEL(log_softmax_backward_kernel, void (*)(const Tensor& grad_out, const Tensor& out, Tensor& grad_in));

enum class Reduction { None, Mean, Sum };
// log_probs [N, C], target int64 [N]; weight [C] may be undefined. out: [] or [N];
// total_weight: [] (the mean's denominator).
LOOM_DECLARE_KERNEL(nll_loss_forward_kernel, void (*)(const Tensor& log_probs, const Tensor& target, const Tensor& weight,
                                                      Reduction reduction, int64_t ignore_index, Tensor& out,
                                                      Tensor& total_weight));
LOOM_DECLARE_KERNEL(nll_loss_backward_kernel, void (*)(const Tensor& grad_out, const Tensor& target, const Tensor& weight,
                                                       Reduction reduction, int64_t ignore_index,
                                                       const Tensor& total_weight, Tensor& grad_in));

// mask = bernoulli(1 - p) / (1 - p) in `in`'s dtype; out = in * mask.
LOOM_DECLARE_KERNEL(dropout_kernel, void (*)(const Tensor& in, double p, Generator& gen, Tensor& out, Tensor& mask));

// ---- transformer kernels -------------------------------------------------------------------
// Their stubs are defined beside the CPU kernels (core/cpu/layer_norm.cpp, gelu.cpp,
// attention.cpp), which core/cpu/transformer_kernels.h declares; the CUDA ones are in
// cuda/transformer.cu and cuda/attention.cu.

// Over the last dim of x [rows, cols]; weight, bias: [cols] or undefined. Writes out
// [rows, cols] and the per-row mean and rstd = 1 / sqrt(biased var + eps) ([rows]).
LOOM_DECLARE_KERNEL(layer_norm_forward_kernel, void (*)(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                        double eps, Tensor& out, Tensor& mean, Tensor& rstd));
// Fills whichever of grad_x ([rows, cols]), grad_weight and grad_bias ([cols]) are defined.
LOOM_DECLARE_KERNEL(layer_norm_backward_kernel,
                    void (*)(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                             const Tensor& rstd, Tensor& grad_x, Tensor& grad_weight, Tensor& grad_bias));
// tanh_approximation: PyTorch's approximate="tanh"; otherwise the exact x * Phi(x).
LOOM_DECLARE_KERNEL(gelu_forward_kernel, void (*)(const Tensor& x, bool tanh_approximation, Tensor& out));
LOOM_DECLARE_KERNEL(gelu_backward_kernel,
                    void (*)(const Tensor& grad_out, const Tensor& x, bool tanh_approximation, Tensor& grad_x));
// Fused attention, out = softmax(scale * q k^T + mask) v without the [L, S] matrix:
// q [*batch, L, E], k [*batch, S, E], v [*batch, S, Ev], N = prod(batch) batch-heads;
// mask undefined or additive, of q's dtype, shape [*batch, L, S], any strides (broadcast
// views); is_causal hides key j from query i < j. Writes out [*batch, L, Ev] and lse
// [N, L], each row's log-sum-exp of its scaled, masked scores: +inf for a row whose every
// key is masked, whose output is NaN and which sends no gradient. Backward fills grad_q,
// grad_k, grad_v (all three). The CPU kernels take operands and outputs of any strides
// with a unit last stride (Note [Attention reads the heads in place]); the CUDA kernels
// take batch = [N] and dense outputs.
LOOM_DECLARE_KERNEL(flash_attention_forward_kernel,
                    void (*)(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                             double scale, Tensor& out, Tensor& lse));
LOOM_DECLARE_KERNEL(flash_attention_backward_kernel,
                    void (*)(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask, bool is_causal, double scale, const Tensor& out, const Tensor& lse,
                             Tensor& grad_q, Tensor& grad_k, Tensor& grad_v));

// ---- optimizers (nn/optim/adamw.h) ----------------------------------------------------------
// One parameter's AdamW update (Note [AdamW update rule], nn/optim/adamw.h), its constants
// computed once on the host. The stub is defined beside the CPU loop in nn/optim/adamw.cpp.
struct AdamWStep {
  double decay_factor;  // 1 - lr * weight_decay
  double beta1, beta2;
  double step_size;     // lr / (1 - beta1^step)
  double bias_correction2_sqrt;
  double eps;
  bool maximize;
};
// param, grad, exp_avg, exp_avg_sq (and max_exp_avg_sq, undefined without amsgrad): one
// shape, dtype and device, contiguous. Updates param and the moments in place.
LOOM_DECLARE_KERNEL(adamw_update_kernel, void (*)(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                                  Tensor& exp_avg_sq, Tensor& max_exp_avg_sq, const AdamWStep& step));

}  // namespace loom
