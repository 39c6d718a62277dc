#include "nn/transformer.h"

#include "autograd/ops.h"  // defines: operator+ (the residual adds)

namespace loom::nn {

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model_, int64_t nhead_, int64_t dim_feedforward_,
                                                 double dropout_, std::string activation_, double layer_norm_eps_,
                                                 bool batch_first_, bool norm_first_, bool bias_)
    : Cloneable("TransformerEncoderLayer"),
      d_model(d_model_),
      nhead(nhead_),
      dim_feedforward(dim_feedforward_),
      dropout_p(dropout_),
      layer_norm_eps(layer_norm_eps_),
      activation_name(std::move(activation_)),
      batch_first(batch_first_),
      norm_first(norm_first_),
      has_bias(bias_) {
  LOOM_CHECK(activation_name == "relu" || activation_name == "gelu", "TransformerEncoderLayer: activation should "
             "be relu/gelu, not ", activation_name);
  LOOM_CHECK(dim_feedforward > 0, "TransformerEncoderLayer: expected a positive dim_feedforward, got ",
             dim_feedforward);
  reset();
}

void TransformerEncoderLayer::reset() {
  self_attn = register_module("self_attn",
                              std::make_shared<MultiheadAttention>(d_model, nhead, dropout_p, has_bias, batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, dim_feedforward, has_bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(dropout_p));
  linear2 = register_module("linear2", std::make_shared<Linear>(dim_feedforward, d_model, has_bias));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, layer_norm_eps, true, has_bias));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, layer_norm_eps, true, has_bias));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(dropout_p));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(dropout_p));
  activation = activation_name == "gelu" ? register_module("activation", std::make_shared<GELU>())
                                         : std::static_pointer_cast<Module>(
                                               register_module("activation", std::make_shared<ReLU>()));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src) { return block(src, Tensor(), Tensor(), false, true); }

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask,
                                        bool is_causal) {
  return block(src, src_mask, src_key_padding_mask, is_causal, false);
}

Tensor TransformerEncoderLayer::block(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask,
                                      bool is_causal, bool hooked_attention) {
  auto sa = [&](const Tensor& x) {
    Tensor y = hooked_attention ? (*self_attn)(x) : self_attn->forward(x, x, x, src_key_padding_mask, src_mask, is_causal);
    return (*dropout1)(y);
  };
  auto ff = [&](const Tensor& x) { return (*dropout2)((*linear2)((*dropout)((*activation)((*linear1)(x))))); };
  if (norm_first) {
    Tensor x = src + sa((*norm1)(src));
    return x + ff((*norm2)(x));
  }
  Tensor x = (*norm1)(src + sa(src));
  return (*norm2)(x + ff(x));
}

}  // namespace loom::nn
