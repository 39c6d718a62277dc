// MultiheadAttention: attention over num_heads subspaces, as torch.nn.MultiheadAttention.
//
//   auto attn = std::make_shared<nn::MultiheadAttention>(192, 3, /*dropout=*/0.0, /*bias=*/true,
//                                                        /*batch_first=*/true);
//   Tensor y = (*attn)(x);                     // self-attention, x [N, L, 192] -> [N, L, 192]
//   Tensor z = attn->forward(q, k, v, pad);    // cross-attention, key_padding_mask pad [N, S]
//
//   q = q_proj(query), k = k_proj(key), v = v_proj(value)     each [N, L or S, E]
//   each split into heads [N, H, L, E / H]; o = scaled_dot_product_attention(q, k, v, mask)
//   out = out_proj(o merged back to [N, L, E])
//
// Note [Separate q, k and v projections]
// PyTorch keeps the three input projections packed in one in_proj_weight [3E, E] and
// in_proj_bias [3E]. loom keeps them as three Linear layers, q_proj, k_proj and v_proj (the
// names of PyTorch's own unpacked parameters when kdim != embed_dim, and of most
// transformer codebases), for tensor parallelism: Megatron's attention splits q, k and v
// by heads, each colwise, and out_proj rowwise. Three Linears take ColwiseParallel each and
// out_proj RowwiseParallel, the plan a Linear-level parallelize_module applies; a packed
// [3E, E] weight sharded by rows would give rank 0 all of q and part of k instead. The
// state_dict therefore has q_proj.weight, ... where PyTorch has in_proj_weight:
// mha_state_dict_to_pytorch / _from_pytorch below convert a whole state_dict (every
// attention in a model) by concatenating or splitting the three, exactly.
//
// Note [Heads from the projection width]
// forward splits q, k and v into heads of head_dim = embed_dim / num_heads features and
// takes the number of heads from the width the projections produced: after a colwise
// split over T ranks each rank computes num_heads / T heads with the same code.
//
// Masks follow PyTorch's MultiheadAttention, not scaled_dot_product_attention: a bool
// attn_mask or key_padding_mask is true where attention is NOT allowed; a float one is
// added to the scores. forward returns the attention output alone, PyTorch's
// need_weights=False: the fused kernel never forms the attention weights.
#pragma once

#include <memory>

#include "nn/linear.h"  // defines: Linear
#include "nn/module.h"  // defines: Module, Cloneable
#include "nn/ordered_dict.h"  // defines: OrderedDict

namespace loom::nn {

class MultiheadAttention : public Cloneable<MultiheadAttention> {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false);
  void reset() override;
  // PyTorch's: q, k, v weights uniform as xavier_uniform_ over the packed [3E, E] (bound
  // sqrt(6 / 4E)), their biases and out_proj's bias 0, out_proj's weight Linear's default.
  void reset_parameters();
  // Self-attention, forward(x, x, x); module(x) runs it with the forward hooks.
  Tensor forward(const Tensor& input) override;
  // query [N, L, E] ([L, N, E] unless batch_first), key and value [N, S, E].
  // key_padding_mask: [N, S]. attn_mask: [L, S] or [N * num_heads, L, S]. is_causal without
  // attn_mask masks key j > query i (with attn_mask it is only a hint, as PyTorch's).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = Tensor(),
                 const Tensor& attn_mask = Tensor(), bool is_causal = false);
  std::string extra_repr() const override;

  int64_t embed_dim, num_heads, head_dim;
  double dropout;  // on the attention weights, in training
  bool has_bias, batch_first;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
};

// See Note [Separate q, k and v projections]: every "<prefix>q_proj.weight",
// "<prefix>k_proj.weight", "<prefix>v_proj.weight" triple becomes "<prefix>in_proj_weight"
// (their concatenation), and the biases "<prefix>in_proj_bias"; other keys pass unchanged,
// in order. _from_pytorch is the inverse.
OrderedDict<Tensor> mha_state_dict_to_pytorch(const OrderedDict<Tensor>& state_dict);
OrderedDict<Tensor> mha_state_dict_from_pytorch(const OrderedDict<Tensor>& state_dict);

}  // namespace loom::nn
