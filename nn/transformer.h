// TransformerEncoderLayer: self-attention and a feed-forward MLP, each in a residual
// branch, as torch.nn.TransformerEncoderLayer (same arguments, defaults and module names).
//
//   auto block = std::make_shared<nn::TransformerEncoderLayer>(
//       /*d_model=*/192, /*nhead=*/3, /*dim_feedforward=*/768, /*dropout=*/0.0, "gelu",
//       /*layer_norm_eps=*/1e-6, /*batch_first=*/true, /*norm_first=*/true);
//   Tensor y = (*block)(x);   // x [N, L, 192] -> [N, L, 192]
//
//   norm_first (pre-norm, ViT's and GPT-2's):   x = x + sa(norm1(x));  x = x + ff(norm2(x))
//   otherwise (post-norm, the 2017 paper's):    x = norm1(x + sa(x));  x = norm2(x + ff(x))
//   sa(x) = dropout1(self_attn(x, x, x)),  ff(x) = dropout2(linear2(dropout(activation(linear1(x)))))
//
// state_dict keys are PyTorch's (self_attn.*, linear1, linear2, norm1, norm2) except
// self_attn's input projection: Note [Separate q, k and v projections]
// (nn/multihead_attention.h). The activation is a child module ("activation", no
// parameters) so that it can be hooked; PyTorch keeps a function there.
#pragma once

#include <memory>
#include <string>

#include "nn/activation.h"           // defines: Dropout, GELU, ReLU
#include "nn/linear.h"               // defines: Linear
#include "nn/multihead_attention.h"  // defines: MultiheadAttention
#include "nn/normalization.h"        // defines: LayerNorm

namespace loom::nn {

class TransformerEncoderLayer : public Cloneable<TransformerEncoderLayer> {
 public:
  // activation: "relu" or "gelu".
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, int64_t dim_feedforward = 2048, double dropout = 0.1,
                          std::string activation = "relu", double layer_norm_eps = 1e-5, bool batch_first = false,
                          bool norm_first = false, bool bias = true);
  void reset() override;
  Tensor forward(const Tensor& src) override;
  // With masks, passed to self_attn (MultiheadAttention's conventions: true = masked).
  // This form calls self_attn->forward directly, so self_attn's own forward hooks do not run
  // (its children's do).
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false);

  int64_t d_model, nhead, dim_feedforward;
  double dropout_p, layer_norm_eps;
  std::string activation_name;
  bool batch_first, norm_first, has_bias;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Module> activation;

 private:
  Tensor block(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask, bool is_causal,
               bool hooked_attention);
};

}  // namespace loom::nn
