#include "nn/multihead_attention.h"

#include <cmath>
#include <limits>
#include <string>

#include "autograd/grad_mode.h"  // defines: NoGradGuard
#include "autograd/ops.h"        // defines: scaled_dot_product_attention, where, cat, split

namespace loom::nn {
namespace {

// PyTorch's MultiheadAttention convention (true = masked) as an additive float mask.
Tensor additive(const Tensor& mask, const Tensor& like) {
  if (mask.dtype() != kBool) return mask;
  return where(mask, wrap_scalar(-std::numeric_limits<double>::infinity(), like), wrap_scalar(0.0, like));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The prefix of `key` before `suffix` when it names a whole module path ("" or "...."), else nullopt.
std::optional<std::string> prefix_of(const std::string& key, const std::string& suffix) {
  if (!ends_with(key, suffix)) return std::nullopt;
  std::string prefix = key.substr(0, key.size() - suffix.size());
  if (!prefix.empty() && prefix.back() != '.') return std::nullopt;
  return prefix;
}

}  // namespace

MultiheadAttention::MultiheadAttention(int64_t embed_dim_, int64_t num_heads_, double dropout_, bool bias_,
                                       bool batch_first_)
    : Cloneable("MultiheadAttention"),
      embed_dim(embed_dim_),
      num_heads(num_heads_),
      head_dim(0),
      dropout(dropout_),
      has_bias(bias_),
      batch_first(batch_first_) {
  LOOM_CHECK(embed_dim > 0 && num_heads > 0, "MultiheadAttention: expected positive embed_dim and num_heads, got ",
             embed_dim, " and ", num_heads);
  LOOM_CHECK(embed_dim % num_heads == 0, "MultiheadAttention: embed_dim must be divisible by num_heads, got "
             "embed_dim=", embed_dim, " and num_heads=", num_heads, " (", embed_dim, " / ", num_heads, " is not a "
             "whole head); choose num_heads among the divisors of ", embed_dim);
  LOOM_CHECK(dropout >= 0 && dropout < 1, "MultiheadAttention: expected dropout in [0, 1), got ", dropout);
  head_dim = embed_dim / num_heads;
  reset();
}

void MultiheadAttention::reset() {
  q_proj = register_module("q_proj", std::make_shared<Linear>(embed_dim, embed_dim, has_bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(embed_dim, embed_dim, has_bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(embed_dim, embed_dim, has_bias));
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, has_bias));
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  const double bound = std::sqrt(6.0 / static_cast<double>(embed_dim + 3 * embed_dim));
  for (const auto& proj : {q_proj, k_proj, v_proj}) {
    init::uniform_(proj->weight, -bound, bound);
    if (has_bias) init::zeros_(proj->bias);
  }
  out_proj->reset_parameters();
  if (has_bias) init::zeros_(out_proj->bias);
}

Tensor MultiheadAttention::forward(const Tensor& input) { return forward(input, input, input); }

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, const Tensor& attn_mask, bool is_causal) {
  check_hooks_ran();  // a split attention's hooks (its f) must not be skipped: Note [Forward hooks run in module(x)]
  const char* layout = batch_first ? "[N, L, E]" : "[L, N, E]";
  for (const Tensor* t : {&query, &key, &value})
    LOOM_CHECK(t->defined() && t->dim() == 3 && t->size(-1) == embed_dim, "MultiheadAttention(embed_dim=", embed_dim,
               ", batch_first=", batch_first ? "true" : "false", "): expected query, key and value of shape ", layout,
               " with E = ", embed_dim, ", got ", t->defined() ? detail::str(t->shape()) : "an undefined tensor");
  // [N, L, E] from here on.
  const Tensor q_in = batch_first ? query : query.transpose(0, 1);
  const Tensor k_in = batch_first ? key : key.transpose(0, 1);
  const Tensor v_in = batch_first ? value : value.transpose(0, 1);
  const int64_t N = q_in.size(0), L = q_in.size(1), S = k_in.size(1);
  LOOM_CHECK(k_in.size(0) == N && v_in.size(0) == N && v_in.shape() == k_in.shape(), "MultiheadAttention: expected "
             "key and value of one shape with query's batch size ", N, ", got query ", query.shape(), ", key ",
             key.shape(), " and value ", value.shape());

  Tensor mask;  // for scaled_dot_product_attention: bool true = attend, or additive
  if (attn_mask.defined()) {
    const bool per_head = attn_mask.dim() == 3;
    LOOM_CHECK(((attn_mask.dim() == 2 && attn_mask.shape() == Shape{L, S}) ||
                    (per_head && attn_mask.shape() == Shape{N * num_heads, L, S})),
               "MultiheadAttention: expected attn_mask of shape [L, S] = [", L, ", ", S, "] or [N * num_heads, L, S] "
               "= [", N * num_heads, ", ", L, ", ", S, "], got ", attn_mask.shape());
    mask = per_head ? attn_mask.reshape({N, num_heads, L, S}) : attn_mask;
  }
  if (key_padding_mask.defined()) {
    LOOM_CHECK((key_padding_mask.shape() == Shape{N, S}), "MultiheadAttention: expected key_padding_mask of shape "
               "[N, S] = [", N, ", ", S, "] (true where a key is padding), got ", key_padding_mask.shape());
    const Tensor pad = additive(key_padding_mask, q_in).reshape({N, 1, 1, S});
    mask = mask.defined() ? additive(mask, q_in) + pad : pad;
  } else if (mask.defined() && mask.dtype() == kBool) {
    mask = eq(mask, zeros({}, TensorOptions(kBool).device(mask.device())));  // true = masked -> true = attend
  }
  const bool causal = is_causal && !mask.defined();

  // See Note [Heads from the projection width]: -1 heads of head_dim features.
  auto heads = [&](const Tensor& x, int64_t len) { return x.reshape({N, len, -1, head_dim}).transpose(1, 2); };
  const Tensor q = heads((*q_proj)(q_in), L), k = heads((*k_proj)(k_in), S), v = heads((*v_proj)(v_in), S);
  const Tensor o = scaled_dot_product_attention(q, k, v, mask, is_training() ? dropout : 0.0, causal);
  const Tensor out = (*out_proj)(o.transpose(1, 2).reshape({N, L, -1}));
  return batch_first ? out : out.transpose(0, 1);
}

std::string MultiheadAttention::extra_repr() const {
  return detail::str("embed_dim=", embed_dim, ", num_heads=", num_heads, ", dropout=", dropout,
                     ", batch_first=", batch_first ? "True" : "False");
}

OrderedDict<Tensor> mha_state_dict_to_pytorch(const OrderedDict<Tensor>& state_dict) {
  NoGradGuard no_grad;
  OrderedDict<Tensor> out;
  for (const auto& item : state_dict) {
    const std::string& key = item.first;
    bool packed = false;
    for (const std::string kind : {"weight", "bias"}) {
      const auto prefix = prefix_of(key, "q_proj." + kind);
      if (!prefix) continue;
      const Tensor* k = state_dict.find(*prefix + "k_proj." + kind);
      const Tensor* v = state_dict.find(*prefix + "v_proj." + kind);
      if (!k || !v) continue;
      out.insert(*prefix + "in_proj_" + kind, cat({item.second.detach(), k->detach(), v->detach()}, 0));
      packed = true;
    }
    if (packed) continue;
    bool part_of_packed = false;  // k_proj / v_proj of a packed triple
    for (const std::string name : {"k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"}) {
      const auto prefix = prefix_of(key, name);
      const std::string kind = ends_with(name, "weight") ? "weight" : "bias";
      if (prefix && state_dict.contains(*prefix + "q_proj." + kind) &&
          state_dict.contains(*prefix + (name[0] == 'k' ? "v_proj." : "k_proj.") + kind))
        part_of_packed = true;
    }
    if (!part_of_packed) out.insert(key, item.second);
  }
  return out;
}

OrderedDict<Tensor> mha_state_dict_from_pytorch(const OrderedDict<Tensor>& state_dict) {
  NoGradGuard no_grad;
  OrderedDict<Tensor> out;
  for (const auto& item : state_dict) {
    bool split_one = false;
    for (const std::string kind : {"weight", "bias"}) {
      const auto prefix = prefix_of(item.first, "in_proj_" + kind);
      if (!prefix) continue;
      LOOM_CHECK(item.second.dim() >= 1 && item.second.size(0) % 3 == 0, "mha_state_dict_from_pytorch: expected ",
                 item.first, " to stack q, k and v along dim 0 (a multiple of 3 rows), got ", item.second.shape());
      const std::vector<Tensor> parts = chunk(item.second.detach(), 3, 0);
      out.insert(*prefix + "q_proj." + kind, parts[0].contiguous());
      out.insert(*prefix + "k_proj." + kind, parts[1].contiguous());
      out.insert(*prefix + "v_proj." + kind, parts[2].contiguous());
      split_one = true;
    }
    if (!split_one) out.insert(item.first, item.second);
  }
  return out;
}

}  // namespace loom::nn
