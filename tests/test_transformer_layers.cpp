// The transformer's layers: LayerNorm, GELU, Embedding, MultiheadAttention and
// TransformerEncoderLayer. Forward against compositions written out here (attention head
// by head, with narrow and cat), gradients through each module by float64 finite
// differences (parameters included), PyTorch's mask conventions, the state_dict
// conversion to PyTorch's packed in_proj_weight, and the errors bad arguments get.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "tensor_compare.h"          // defines: max_abs_diff
#include "gradcheck.h"               // defines: gradcheck, leaf
#include "nn/embedding.h"            // defines: Embedding
#include "nn/multihead_attention.h"  // defines: MultiheadAttention, mha_state_dict_to_pytorch
#include "nn/normalization.h"        // defines: LayerNorm
#include "nn/transformer.h"          // defines: TransformerEncoderLayer

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;
using loom::testing::max_abs_diff;

namespace {

// Gradient check of module(x) with respect to x and every parameter (float64).
void gradcheck_module(nn::Module& module, const Tensor& x) {
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : module.parameters()) inputs.push_back(p);
  gradcheck([&](const std::vector<Tensor>& in) { return module(in[0]); }, inputs);
}

// MultiheadAttention written out head by head: each head's columns by narrow, its softmax
// attention by matmul, the heads joined by cat. additive: undefined or [N, L, S].
Tensor reference_mha(nn::MultiheadAttention& m, const Tensor& query, const Tensor& key, const Tensor& value,
                     const Tensor& additive = Tensor()) {
  Tensor q = linear(query, m.q_proj->weight, m.q_proj->bias), k = linear(key, m.k_proj->weight, m.k_proj->bias);
  Tensor v = linear(value, m.v_proj->weight, m.v_proj->bias);
  std::vector<Tensor> heads;
  for (int64_t h = 0; h < m.num_heads; ++h) {
    Tensor qh = narrow(q, -1, h * m.head_dim, m.head_dim), kh = narrow(k, -1, h * m.head_dim, m.head_dim);
    Tensor scores = matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(m.head_dim));
    if (additive.defined()) scores = scores + additive;
    heads.push_back(matmul(softmax(scores, -1), narrow(v, -1, h * m.head_dim, m.head_dim)));
  }
  return linear(cat(heads, -1), m.out_proj->weight, m.out_proj->bias);
}

std::shared_ptr<nn::MultiheadAttention> mha64(int64_t E, int64_t H, bool batch_first = true) {
  auto m = std::make_shared<nn::MultiheadAttention>(E, H, 0.0, true, batch_first);
  m->to(kFloat64);
  for (const Tensor& p : m->parameters()) nn::init::normal_(p, 0.0, 0.5);  // nonzero biases too
  return m;
}

}  // namespace

TEST_CASE("LayerNorm: parameters, initialisation, forward as layer_norm, gradients") {
  nn::LayerNorm norm({2, 3}, 1e-6);
  CHECK(norm.weight.shape() == Shape{2, 3});
  CHECK(norm.weight.tolist<float>() == std::vector<float>(6, 1.0f));
  CHECK(norm.bias.tolist<float>() == std::vector<float>(6, 0.0f));
  CHECK(norm.named_parameters().keys() == std::vector<std::string>{"weight", "bias"});
  CHECK(nn::LayerNorm({4}, 1e-5, /*elementwise_affine=*/false).parameters().empty());
  CHECK(nn::LayerNorm({4}, 1e-5, true, /*bias=*/false).named_parameters().keys() == std::vector<std::string>{"weight"});
  CHECK(norm.str() == "LayerNorm((2, 3), eps=1e-06, elementwise_affine=True)");
  norm.to(kFloat64);
  nn::init::normal_(norm.weight);
  nn::init::normal_(norm.bias);
  Tensor x = leaf({4, 2, 3}, 1);
  CHECK(max_abs_diff(norm(x), layer_norm(x, {2, 3}, norm.weight, norm.bias, 1e-6)) == 0);
  gradcheck_module(norm, x);
  CHECK_THROWS_WITH_AS(norm(zeros({4, 3, 2}, kFloat64)), doctest::Contains("expected input with shape [*, [2, 3]]"),
                       Error);
}

TEST_CASE("GELU: the module is the function, with PyTorch's repr") {
  Tensor x = leaf({3, 5}, 2);
  CHECK(max_abs_diff(nn::GELU()(x), gelu(x)) == 0);
  CHECK(max_abs_diff(nn::GELU("tanh")(x), gelu(x, "tanh")) == 0);
  CHECK(nn::GELU("tanh").str() == "GELU(approximate='tanh')");
  CHECK_THROWS_WITH_AS(nn::GELU("fast"), doctest::Contains("\"none\" or \"tanh\""), Error);
}

TEST_CASE("Embedding: rows by index, gradients summed over repeated indices, errors") {
  nn::Embedding embed(5, 3);
  embed.to(kFloat64);
  Tensor ids = from_vector<int64_t>({4, 0, 4, 2}, {2, 2});
  Tensor y = embed(ids);
  CHECK(y.shape() == Shape{2, 2, 3});
  CHECK(max_abs_diff(select(select(y, 0, 1), 0, 0), select(embed.weight, 0, 4)) == 0);
  sum(y).backward();
  CHECK(embed.weight.grad().tolist<double>() ==
        std::vector<double>{1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 2, 2, 2});
  CHECK_THROWS_WITH_AS(embed(from_vector<int64_t>({5}, {1})), doctest::Contains("expected indices in [0, 5)"), Error);
  CHECK_THROWS_WITH_AS(embed(zeros({2}, kFloat32)), doctest::Contains("expected int64 indices"), Error);
}

TEST_CASE("MultiheadAttention equals attention written head by head; batch_first=false is its transpose") {
  auto m = mha64(6, 3);
  CHECK(m->named_parameters().keys() ==
        std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                                 "v_proj.bias", "out_proj.weight", "out_proj.bias"});
  Tensor x = leaf({2, 4, 6}, 3), kv = leaf({2, 5, 6}, 4);
  CHECK(max_abs_diff((*m)(x), reference_mha(*m, x, x, x)) < 1e-12);
  CHECK(max_abs_diff(m->forward(x, kv, kv), reference_mha(*m, x, kv, kv)) < 1e-12);
  auto seq_first = std::dynamic_pointer_cast<nn::MultiheadAttention>(m->clone());
  seq_first->batch_first = false;
  CHECK(max_abs_diff((*seq_first)(x.transpose(0, 1)).transpose(0, 1), (*m)(x)) < 1e-12);
}

TEST_CASE("MultiheadAttention masks follow PyTorch's MultiheadAttention: bool true means masked") {
  auto m = mha64(4, 2);
  Tensor x = leaf({2, 3, 4}, 5), kv = leaf({2, 4, 4}, 6);
  const double inf = std::numeric_limits<double>::infinity();
  // key_padding_mask [N, S]: sample 0 ignores key 3, sample 1 keys 0 and 1.
  Tensor pad = gt(from_vector<double>({0, 0, 0, 1, 1, 1, 0, 0}, {2, 4}), zeros({}, kFloat64));
  Tensor pad_add = where(pad, full({}, -inf, kFloat64), zeros({}, kFloat64)).reshape({2, 1, 4});
  CHECK(max_abs_diff(m->forward(x, kv, kv, pad), reference_mha(*m, x, kv, kv, pad_add)) < 1e-12);
  // A bool attn_mask [L, S], and the same as a float mask; both together with the padding.
  Tensor blocked = gt(from_vector<double>({0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0}, {3, 4}), zeros({}, kFloat64));
  Tensor blocked_add = where(blocked, full({}, -inf, kFloat64), zeros({}, kFloat64));
  CHECK(max_abs_diff(m->forward(x, kv, kv, Tensor(), blocked), reference_mha(*m, x, kv, kv, blocked_add)) < 1e-12);
  CHECK(max_abs_diff(m->forward(x, kv, kv, Tensor(), blocked_add), reference_mha(*m, x, kv, kv, blocked_add)) < 1e-12);
  CHECK(max_abs_diff(m->forward(x, kv, kv, pad, blocked), reference_mha(*m, x, kv, kv, blocked_add + pad_add)) < 1e-12);
  // is_causal without a mask.
  Tensor causal = where(gt(arange(3).reshape({3, 1}), arange(3).reshape({1, 3})), zeros({}, kFloat64),
                        zeros({}, kFloat64));
  causal = where(lt(arange(3).reshape({3, 1}), arange(3).reshape({1, 3})), full({}, -inf, kFloat64), causal);
  CHECK(max_abs_diff(m->forward(x, x, x, Tensor(), Tensor(), true), reference_mha(*m, x, x, x, causal)) < 1e-12);
  CHECK_THROWS_WITH_AS(m->forward(x, kv, kv, Tensor(), zeros({3, 5}, kBool)),
                       doctest::Contains("expected attn_mask of shape [L, S] = [3, 4]"), Error);
  CHECK_THROWS_WITH_AS(m->forward(x, kv, kv, zeros({2, 3}, kBool)),
                       doctest::Contains("key_padding_mask of shape [N, S] = [2, 4]"), Error);
}

TEST_CASE("MultiheadAttention gradients: input and every projection by finite differences") {
  auto m = mha64(4, 2);
  gradcheck_module(*m, leaf({2, 3, 4}, 7));
}

TEST_CASE("MultiheadAttention refuses heads that do not divide the width, and inputs of the wrong width") {
  CHECK_THROWS_WITH_AS(nn::MultiheadAttention(192, 5),
                       doctest::Contains("embed_dim must be divisible by num_heads, got embed_dim=192 and num_heads=5"),
                       Error);
  nn::MultiheadAttention m(8, 2, 0.0, true, true);
  CHECK_THROWS_WITH_AS(m(zeros({2, 3, 6})), doctest::Contains("expected query, key and value of shape [N, L, E] with "
                                                              "E = 8, got [2, 3, 6]"), Error);
}

TEST_CASE("MultiheadAttention's state_dict converts to PyTorch's packed in_proj_weight and back, exactly") {
  nn::TransformerEncoderLayer layer(8, 2, 16, 0.0, "gelu", 1e-5, true, true);
  auto ours = layer.state_dict();
  auto torch_style = nn::mha_state_dict_to_pytorch(ours);
  CHECK(torch_style.keys() ==
        std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                                 "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                                 "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"});
  CHECK(torch_style["self_attn.in_proj_weight"].shape() == Shape{24, 8});
  CHECK(max_abs_diff(narrow(torch_style["self_attn.in_proj_weight"], 0, 8, 8), ours["self_attn.k_proj.weight"]) == 0);
  auto back = nn::mha_state_dict_from_pytorch(torch_style);
  nn::TransformerEncoderLayer other(8, 2, 16, 0.0, "gelu", 1e-5, true, true);
  other.load_state_dict(back);
  for (const auto& item : ours) CHECK(max_abs_diff(other.state_dict()[item.first], item.second) == 0);
}

TEST_CASE("TransformerEncoderLayer: pre-norm and post-norm equal their compositions; gradients; clone") {
  for (const bool norm_first : {true, false}) {
    CAPTURE(norm_first);
    nn::TransformerEncoderLayer layer(4, 2, 6, 0.0, "gelu", 1e-5, true, norm_first);
    layer.to(kFloat64);
    for (const Tensor& p : layer.parameters()) nn::init::normal_(p, 0.0, 0.5);
    Tensor x = leaf({2, 3, 4}, 8);
    auto& sa = *layer.self_attn;
    auto ln = [](const Tensor& t, const nn::LayerNorm& n) { return layer_norm(t, {4}, n.weight, n.bias); };
    auto ff = [&](const Tensor& t) {
      return linear(gelu(linear(t, layer.linear1->weight, layer.linear1->bias)), layer.linear2->weight,
                    layer.linear2->bias);
    };
    Tensor want;
    if (norm_first) {
      Tensor h = x + reference_mha(sa, ln(x, *layer.norm1), ln(x, *layer.norm1), ln(x, *layer.norm1));
      want = h + ff(ln(h, *layer.norm2));
    } else {
      Tensor h = ln(x + reference_mha(sa, x, x, x), *layer.norm1);
      want = ln(h + ff(h), *layer.norm2);
    }
    CHECK(max_abs_diff(layer(x), want) < 1e-12);
    gradcheck_module(layer, x);
    auto copy = layer.clone();
    CHECK(max_abs_diff((*copy)(x), layer(x)) == 0);
  }
  CHECK_THROWS_WITH_AS(nn::TransformerEncoderLayer(4, 2, 6, 0.1, "swish"), doctest::Contains("relu/gelu, not swish"),
                       Error);
}

TEST_CASE("TransformerEncoderLayer dropout: active in training, identity in eval") {
  nn::TransformerEncoderLayer layer(8, 2, 16, 0.5, "relu", 1e-5, true, true);
  Tensor x = randn({2, 5, 8});
  layer.eval();
  Tensor a = layer(x), b = layer(x);
  CHECK(max_abs_diff(a, b) == 0);
  layer.train();
  CHECK(max_abs_diff(layer(x), a) > 0);
}

TEST_CASE("init::trunc_normal_: every value inside [a, b], the truncated distribution's moments") {
  Tensor t = empty({20000}, kFloat64);
  Generator gen(3);
  nn::init::trunc_normal_(t, 0.0, 1.0, -0.5, 0.5, &gen);
  CHECK(min(t).item<double>() >= -0.5);
  CHECK(max(t).item<double>() <= 0.5);
  // Normal(0, 1) cut to [-0.5, 0.5]: standard deviation 0.2822.
  CHECK(std::sqrt(var(t, {0}).item<double>()) == doctest::Approx(0.2822).epsilon(0.02));
  CHECK(std::abs(mean(t).item<double>()) < 0.01);
  CHECK_THROWS_WITH_AS(nn::init::trunc_normal_(t, 0.0, 1.0, 40.0, 41.0), doctest::Contains("widen the interval"),
                       Error);
}
