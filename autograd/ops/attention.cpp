// scaled_dot_product_attention (torch.nn.functional.scaled_dot_product_attention):
//
//   out = softmax(query @ key^T * scale + mask) @ value,   scale = 1 / sqrt(E) by default
//
// query [*, L, E], key [*, S, E], value [*, S, Ev] with the same batch dims (usually
// [batch, heads]); attn_mask broadcasts to [*, L, S]: bool (true = take part, as
// PyTorch's) or additive, of query's dtype; is_causal hides key j from every query
// i < j (PyTorch's top-left causal mask, tril(ones(L, S))).
//
// Note [Which attention runs]
// As PyTorch, loom picks a kernel per call, and all of them compute the same function:
// - the fused kernel (flash_attention_forward_kernel: Note [Flash attention on the CPU],
//   core/cpu/attention.cpp, and Note [Flash attention on the GPU], cuda/attention.cu),
//   which keeps no [L, S] matrix for backward: dropout_p == 0 and a mask, if any, that
//   needs no gradient, on any device. This is what a transformer trains with.
// - the math path, the composition matmul -> softmax -> dropout -> matmul, whose every
//   op is differentiable: attention dropout (whose mask would have to be drawn again in
//   backward) and a mask that requires grad.
//
// The CPU kernel reads q, k, v where they lie, MultiheadAttention's transposed heads
// included, and this op allocates the output and the gradients in their inputs' layout,
// so that no head is copied either way (Note [Attention reads the heads in place],
// core/cpu/attention.cpp). The CUDA kernels read dense [N, L, E]: there the batch dims
// are flattened, which copies a transposed view.
#include <algorithm>  // defines: std::stable_sort (empty_in_layout_of)
#include <cmath>
#include <numeric>    // defines: std::iota
#include <limits>
#include <optional>

#include "autograd/ops.h"                  // declares: scaled_dot_product_attention, matmul, softmax, dropout
#include "autograd/ops/common.h"           // defines: check_defined, check_floating, check_same_device_dtype, statistics_options
#include "core/kernels.h"                  // declares: flash_attention_forward_kernel, flash_attention_backward_kernel

namespace loom {
namespace {

using Grads = std::vector<Tensor>;
constexpr const char* kOp = "scaled_dot_product_attention";

TensorOptions options_of(const Tensor& t) { return TensorOptions(t.dtype()).device(t.device()); }

Shape batch_dims(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double dropout_p,
                  bool is_causal) {
  ops::check_defined(kOp, q, "query");
  ops::check_defined(kOp, k, "key");
  ops::check_defined(kOp, v, "value");
  ops::check_floating(kOp, q);
  ops::check_same_device_dtype(kOp, q, k);
  ops::check_same_device_dtype(kOp, q, v);
  LOOM_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), kOp, ": expected query [*, L, E], key "
             "[*, S, E] and value [*, S, Ev] of one rank (at least 2), got ", q.shape(), ", ", k.shape(), " and ",
             v.shape());
  LOOM_CHECK(batch_dims(k) == batch_dims(q) && batch_dims(v) == batch_dims(q), kOp, ": expected key and value to "
             "have query's batch dims ", batch_dims(q), ", got key ", k.shape(), " and value ", v.shape());
  LOOM_CHECK(k.size(-1) == q.size(-1), kOp, ": expected key's embedding dim to equal query's (", q.size(-1),
             "), got key ", k.shape(), " for query ", q.shape());
  LOOM_CHECK(v.size(-2) == k.size(-2), kOp, ": expected value to have as many rows as key (S = ", k.size(-2),
             "), got value ", v.shape(), " for key ", k.shape());
  LOOM_CHECK(dropout_p >= 0 && dropout_p < 1, kOp, ": expected dropout_p in [0, 1), got ", dropout_p);
  if (!mask.defined()) return;
  LOOM_CHECK(!is_causal, kOp, ": pass either attn_mask or is_causal=true, not both (PyTorch refuses an explicit "
             "attn_mask with is_causal); fold the causal mask into attn_mask instead");
  LOOM_CHECK(mask.dtype() == kBool || mask.dtype() == q.dtype(), kOp, ": expected attn_mask of dtype bool (true "
             "= attend) or of query's dtype ", q.dtype(), " (added to the scores), got ", mask.dtype());
  LOOM_CHECK(mask.device() == q.device(), kOp, ": expected attn_mask on query's device ", q.device(), ", got ",
             mask.device());
  Shape target = batch_dims(q);
  target.push_back(q.size(-2));
  target.push_back(k.size(-2));
  bool broadcasts = mask.dim() <= static_cast<int64_t>(target.size());
  for (int64_t d = 1; broadcasts && d <= mask.dim(); ++d) {
    const int64_t m = mask.size(-d), t = target[target.size() - static_cast<size_t>(d)];
    broadcasts = m == t || m == 1;
  }
  LOOM_CHECK(broadcasts, kOp, ": expected attn_mask broadcastable to the attention's shape ", target,
             " ([*batch, L, S]: one value per query and key), got ", mask.shape());
}

// A bool mask as an additive one: 0 where true (attend), -inf where false.
Tensor additive_mask(const Tensor& mask, const Tensor& like) {
  if (mask.dtype() != kBool) return mask;
  return where(mask, wrap_scalar(0.0, like), wrap_scalar(-std::numeric_limits<double>::infinity(), like));
}

// A dense tensor of `shape` (of `like`'s rank) whose dims lie in memory in the order of
// `like`'s strides, largest first, with the last dim innermost: for MultiheadAttention's
// [N, H, L, E] view of [N, L, H*E] rows, a tensor laid out as [N, L, H, E] (PyTorch's
// empty_like keeps a permuted layout the same way).
Tensor empty_in_layout_of(const Tensor& like, const Shape& shape) {
  const int64_t rank = like.dim();
  std::vector<int64_t> order(static_cast<size_t>(rank - 1));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  order.push_back(rank - 1);
  Shape dense_shape, inverse(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) {
    dense_shape.push_back(shape[static_cast<size_t>(order[static_cast<size_t>(i)])]);
    inverse[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  }
  return empty(dense_shape, options_of(like)).permute(inverse);
}

// See Note [Which attention runs]: the composition, differentiable op by op.
Tensor math_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double dropout_p,
                      bool is_causal, double scale, Generator* gen) {
  Tensor scores = matmul(q, k.transpose(-2, -1)) * scale;
  if (is_causal) {
    const int64_t L = q.size(-2), S = k.size(-2);
    Tensor keep = le(arange(S).reshape({1, S}), arange(L).reshape({L, 1}));  // tril(ones(L, S))
    scores = scores + additive_mask(keep.to(q.device()), q);
  }
  if (mask.defined()) scores = scores + additive_mask(mask, q);
  Tensor attn = softmax(scores, -1);
  if (dropout_p > 0) attn = dropout(attn, dropout_p, /*training=*/true, gen);
  return matmul(attn, v);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, Generator* gen) {
  check_inputs(query, key, value, attn_mask, dropout_p, is_causal);
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
  const bool mask_needs_grad = attn_mask.defined() && any_requires_grad({attn_mask});
  if (dropout_p > 0 || mask_needs_grad)
    return math_attention(query, key, value, attn_mask, dropout_p, is_causal, s, gen);

  const Shape batch = batch_dims(query);
  const int64_t N = numel(batch), L = query.size(-2), S = key.size(-2), Ev = value.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(L);
  out_shape.push_back(Ev);
  // The CPU kernel takes the batch dims and strides as they are; the CUDA kernels read
  // [N, rows, cols], which flattening makes (a copy for a transposed view).
  const bool in_place = query.device().is_cpu();
  auto flat = [&](const Tensor& t) { return in_place ? t.detach() : t.detach().reshape({N, t.size(-2), t.size(-1)}); };
  const Tensor q = flat(query), k = flat(key), v = flat(value);
  Tensor mask;
  if (attn_mask.defined()) {
    Shape full = batch;
    full.push_back(L);
    full.push_back(S);
    mask = additive_mask(attn_mask.detach(), query).expand(full);  // a view: never [N, L, S] in memory
  }
  Tensor out = in_place ? empty_in_layout_of(query, out_shape) : empty({N, L, Ev}, options_of(query));
  Tensor lse = empty({N, L}, ops::statistics_options(query));  // float32 for 16-bit queries
  if (N * L > 0) flash_attention_forward_kernel(query.device())(q, k, v, mask, is_causal, s, out, lse);
  Tensor result = in_place ? out : out.view(out_shape);
  if (!any_requires_grad({query, key, value})) return result;
  // Saved: q, k, v, the output and lse; see Note [Flash attention on the CPU].
  const char* name = "ScaledDotProductFlashAttentionBackward";
  record(name, {query, key, value}, {result},
         [q_ = SavedTensor(q, name), k_ = SavedTensor(k, name), v_ = SavedTensor(v, name),
          out_ = SavedTensor(out, name), mask_ = SavedTensor(mask, name), lse, is_causal, s, q_shape = query.shape(),
          k_shape = key.shape(), v_shape = value.shape()](const Grads& g) {
           const Tensor& q = q_.get();
           const Tensor& k = k_.get();
           const Tensor& v = v_.get();
           const Tensor& out = out_.get();
           if (lse.numel() == 0)  // no queries: nothing reached k or v
             return Grads{zeros(q_shape, options_of(q)), zeros(k_shape, options_of(k)), zeros(v_shape, options_of(v))};
           // Each gradient in its input's layout, so the views above it need no copy either.
           Tensor grad_q = empty_in_layout_of(q, q.shape()), grad_k = empty_in_layout_of(k, k.shape());
           Tensor grad_v = empty_in_layout_of(v, v.shape());
           ops::check_same_device_dtype(kOp, g[0], q);
           flash_attention_backward_kernel(q.device())(g[0].reshape(out.shape()), q, k, v, mask_.get(), is_causal, s,
                                                       out, lse, grad_q, grad_k, grad_v);
           return Grads{grad_q.reshape(q_shape), grad_k.reshape(k_shape), grad_v.reshape(v_shape)};
         });
  return result;
}

}  // namespace loom
