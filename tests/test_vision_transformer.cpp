// VisionTransformer: the documented parameter counts and names, timm's initialisation, the
// sequential() view (same outputs, same parameters), gradients of a small ViT by float64
// finite differences, and the errors bad configurations and inputs get.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "autograd/grad_mode.h"     // defines: NoGradGuard
#include "tensor_compare.h"         // defines: max_abs_diff
#include "gradcheck.h"              // defines: gradcheck, leaf
#include "nn/vision_transformer.h"  // defines: VisionTransformer, vit_tiny, vit_small

using namespace loom;
using loom::testing::gradcheck;
using loom::testing::leaf;
using loom::testing::max_abs_diff;

namespace {

int64_t count(const nn::Module& m) {
  int64_t total = 0;
  for (const Tensor& p : m.parameters()) total += p.numel();
  return total;
}

// A ViT small enough for finite differences: 8x8 images, 4 patches of 4x4, width 4.
nn::VisionTransformerOptions micro() {
  return {.image_size = 8, .patch_size = 4, .num_layers = 2, .num_heads = 2, .hidden_dim = 4, .mlp_dim = 8,
          .num_classes = 3};
}

}  // namespace

TEST_CASE("vit_tiny and vit_small have the parameter counts in the header, and timm's names") {
  auto tiny = nn::vit_tiny();
  CHECK(count(*tiny) == 5362762);
  CHECK(count(*nn::vit_small()) == 21342346);
  auto keys = tiny->state_dict().keys();
  CHECK(keys.size() == 4 + 12 * 16 + 4);
  CHECK(keys[0] == "cls_token");
  CHECK(keys[1] == "pos_embed");
  CHECK(keys[2] == "patch_embed.weight");
  CHECK(keys[4] == "blocks.0.self_attn.q_proj.weight");
  CHECK(keys.back() == "head.bias");
  CHECK(tiny->pos_embed.shape() == Shape{1, 65, 192});
  CHECK(tiny->num_patches() == 64);
}

TEST_CASE("vit_tiny is initialised as timm's: trunc_normal(0.02) Linears and tokens, zero biases, LayerNorm 1 and 0") {
  auto model = nn::vit_tiny();
  auto sd = model->state_dict();
  auto stddev = [](const Tensor& t) { return std::sqrt(var(t.to(kFloat64).reshape({-1}), {0}).item<double>()); };
  for (const char* name : {"blocks.3.self_attn.k_proj.weight", "blocks.11.linear2.weight", "head.weight", "pos_embed"})
    CHECK(stddev(sd[name]) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(max(abs(sd["blocks.0.linear1.bias"])).item<float>() == 0);
  CHECK(max(abs(sd["blocks.5.self_attn.out_proj.bias"])).item<float>() == 0);
  CHECK(min(sd["blocks.2.norm1.weight"]).item<float>() == 1);
  CHECK(max(abs(sd["norm.bias"])).item<float>() == 0);
  // The patch embedding keeps Conv2d's default: U(-1/sqrt(48), 1/sqrt(48)).
  CHECK(max(abs(sd["patch_embed.weight"])).item<float>() <= 1 / std::sqrt(48.0f));
  CHECK(stddev(sd["patch_embed.weight"]) > 0.05);
}

TEST_CASE("sequential() computes the same logits from the same parameters") {
  auto model = nn::vit_tiny();
  model->eval();
  auto seq = model->sequential();
  CHECK(seq->size() == 2 + 12 + 3);
  CHECK(!seq->is_training());
  CHECK(count(*seq) == count(*model));
  std::set<const TensorImpl*> ours, viewed;
  for (const Tensor& p : model->parameters()) ours.insert(p.unsafe_impl());
  for (const Tensor& p : seq->parameters()) viewed.insert(p.unsafe_impl());
  CHECK(ours == viewed);  // the same tensors, not copies
  NoGradGuard no_grad;
  Tensor images = randn({2, 3, 32, 32});
  CHECK(max_abs_diff((*seq)(images), (*model)(images)) == 0);
  // A change to the model's parameters is a change to the view's.
  model->pos_embed.detach().fill_(0.5);
  CHECK(max_abs_diff((*seq)(images), (*model)(images)) == 0);
}

TEST_CASE("a small ViT's gradients: images and every parameter by finite differences (float64)") {
  auto model = std::make_shared<nn::VisionTransformer>(micro());
  model->to(kFloat64);
  for (const Tensor& p : model->parameters()) nn::init::normal_(p, 0.0, 0.3);  // away from the zero-bias start
  std::vector<Tensor> inputs = {leaf({2, 3, 8, 8}, 5)};
  for (const Tensor& p : model->parameters()) inputs.push_back(p);
  gradcheck([&](const std::vector<Tensor>& in) { return (*model)(in[0]); }, inputs);
}

TEST_CASE("clone() copies a ViT exactly and shares nothing") {
  auto model = std::make_shared<nn::VisionTransformer>(micro());
  auto copy = std::dynamic_pointer_cast<nn::VisionTransformer>(model->clone());
  REQUIRE(copy);
  Tensor images = randn({2, 3, 8, 8});
  CHECK(max_abs_diff((*copy)(images), (*model)(images)) == 0);
  CHECK(!copy->pos_embed.is_same(model->pos_embed));
  auto seq_copy = model->sequential()->clone();
  CHECK(max_abs_diff((*seq_copy)(images), (*model)(images)) == 0);
}

TEST_CASE("VisionTransformer says what it expected: patch size, heads, image shape") {
  auto options = micro();
  options.patch_size = 3;
  CHECK_THROWS_WITH_AS(nn::VisionTransformer{options},
                       doctest::Contains("the patch size must divide the image size, got patch_size=3 for image_size=8"),
                       Error);
  options = micro();
  options.num_heads = 3;
  CHECK_THROWS_WITH_AS(nn::VisionTransformer{options},
                       doctest::Contains("embed_dim must be divisible by num_heads, got embed_dim=4 and num_heads=3"),
                       Error);
  nn::VisionTransformer model(micro());
  CHECK_THROWS_WITH_AS(model(zeros({2, 3, 32, 32})), doctest::Contains("expected images of shape [N, 3, 8, 8], got "
                                                                       "[2, 3, 32, 32]"), Error);
}
