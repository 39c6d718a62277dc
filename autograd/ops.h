// The differentiable ops: what users call, named as in PyTorch (torch.add, torch.cat,
// F.conv2d, ...). Each records a Node when grad mode is on and an input requires grad;
// its forward and its gradient formula sit side by side in autograd/ops/<family>.cpp.
//
// Families: elementwise.cpp (arithmetic, broadcasting, activations, comparisons),
// reduce.cpp (sum, mean, var, max/min), linalg.cpp (matmul, linear), view.cpp (reshape,
// permute, narrow, expand, ...), index.cpp (cat, stack, split, index_select, gather),
// nn.cpp (conv2d, pooling, batch_norm, log_softmax, losses, dropout); the transformer's:
// layer_norm.cpp, gelu.cpp, attention.cpp (scaled_dot_product_attention).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/factory.h"
#include "core/kernels.h"
#include "core/tensor.h"

namespace loom {

// ---- elementwise (broadcasting) ---------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor abs(const Tensor& x);
Tensor clamp(const Tensor& x, double min, double max);
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
// Comparisons return bool tensors and are not differentiable.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
// cond ? a : b, broadcasting all three; differentiable in a and b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// A scalar operand takes the tensor's dtype and device (PyTorch's "wrapped number").
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
// A 0-dim tensor like `like` (dtype, device) holding value.
Tensor wrap_scalar(double value, const Tensor& like);
// Sums `grad` down to `shape`: the gradient of broadcasting from shape to grad.shape().
Tensor sum_to(const Tensor& grad, const Shape& shape);

// ---- reductions ------------------------------------------------------------------------
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim = false);
// Variance over dims; unbiased divides by N - 1, as torch.var's default.
Tensor var(const Tensor& x, const Shape& dims, bool unbiased = true, bool keepdim = false);
Tensor max(const Tensor& x);  // over all elements
Tensor min(const Tensor& x);
// (values, indices) along dim, as torch.max(x, dim).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);

// ---- linear algebra ---------------------------------------------------------------------
// 1-D/2-D/batched as torch.matmul: [.., M, K] @ [.., K, N], batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
// x [.., in] @ weight[out, in]^T + bias[out] (bias may be undefined).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- views and movement ---------------------------------------------------------------
Tensor view(const Tensor& x, const Shape& shape);  // -1 infers one dim; needs compatible strides
Tensor reshape(const Tensor& x, const Shape& shape);  // a view when possible, else a copy
Tensor permute(const Tensor& x, const Shape& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& x, int64_t dim, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);  // -1 keeps a dim
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor contiguous(const Tensor& x);
// x in `format` (a differentiable copy, or x itself if it already is); Note [Channels-last activations].
Tensor contiguous(const Tensor& x, MemoryFormat format);
Tensor clone(const Tensor& x);
// Differentiable moves: gradients flow back to the source device / dtype.
Tensor to(const Tensor& x, Device device, bool non_blocking = false);
Tensor to(const Tensor& x, DType dtype);

// ---- joining, splitting, indexing ------------------------------------------------------
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// torch.flip: the input reversed along each of `dims` (a copy, never a view).
Tensor flip(const Tensor& x, const Shape& dims);
// torch.nn.functional.pad: `padding` holds (before, after) pairs for the last dims, last dim
// first ({left, right, top, bottom} for an image); mode "constant" (filled with value),
// "reflect", "replicate" or "circular". See Note [Padding as an index map] (ops/pad.cpp).
Tensor pad(const Tensor& x, const std::vector<int64_t>& padding, const std::string& mode = "constant",
           double value = 0.0);

// ---- neural-network functions (torch.nn.functional) -------------------------------------
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              std::vector<int64_t> dilation = {1, 1}, int64_t groups = 1);
Tensor max_pool2d(const Tensor& input, std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0}, std::vector<int64_t> dilation = {1, 1},
                  bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
                  std::vector<int64_t> padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& input, std::vector<int64_t> output_size);
// running_mean / running_var may be undefined (then batch statistics are always used).
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                  double eps = 1e-5);
// relu(batch_norm(input, ...) + residual) as one op, residual optional: the ResNet pattern
// without the intermediate tensors (Note [Fused BatchNorm epilogue] in ops/nn.cpp).
Tensor batch_norm_relu(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                       double eps = 1e-5, const Tensor& residual = Tensor());
Tensor log_softmax(const Tensor& input, int64_t dim);
Tensor softmax(const Tensor& input, int64_t dim);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const Tensor& weight = Tensor(),
                Reduction reduction = Reduction::Mean, int64_t ignore_index = -100);
Tensor cross_entropy(const Tensor& input, const Tensor& target, const Tensor& weight = Tensor(),
                     Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
Tensor dropout(const Tensor& input, double p, bool training, Generator* gen = nullptr);

// ---- transformer functions (CPU; on CUDA an error says so, except attention's math path) ----
// Normalises over the trailing dims `normalized_shape` (biased variance); weight and bias,
// of that shape, may be undefined.
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// approximate: "none" (x * Phi(x), with erf) or "tanh".
Tensor gelu(const Tensor& input, const std::string& approximate = "none");
// softmax(query @ key^T * scale + attn_mask) @ value over [*, L, E] / [*, S, E] / [*, S, Ev];
// attn_mask bool (true = attend) or additive, broadcastable to [*, L, S]; scale defaults to
// 1 / sqrt(E); dropout_p > 0 drops attention weights (always, as PyTorch's function: pass 0
// in eval). Note [Which attention runs] in ops/attention.cpp.
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);

}  // namespace loom
