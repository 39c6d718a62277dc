#include "nn/vision_transformer.h"

#include "autograd/ops.h"  // defines: cat, flatten, select, expand

namespace loom::nn {
namespace {

void check_options(const VisionTransformerOptions& o) {
  LOOM_CHECK(o.image_size > 0 && o.patch_size > 0, "VisionTransformer: expected positive image_size and "
             "patch_size, got ", o.image_size, " and ", o.patch_size);
  LOOM_CHECK(o.image_size % o.patch_size == 0, "VisionTransformer: the patch size must divide the image size, got "
             "patch_size=", o.patch_size, " for image_size=", o.image_size, " (", o.image_size, " / ", o.patch_size,
             " leaves a partial patch); choose a divisor of ", o.image_size, ", e.g. 4 for 32x32 images");
  LOOM_CHECK(o.num_layers >= 0 && o.mlp_dim > 0 && o.num_classes > 0 && o.in_channels > 0,
             "VisionTransformer: expected num_layers >= 0 and positive mlp_dim, num_classes and in_channels, got ",
             o.num_layers, ", ", o.mlp_dim, ", ", o.num_classes, " and ", o.in_channels);
  // hidden_dim and num_heads: MultiheadAttention checks that the heads divide the width.
}

int64_t patches_of(const VisionTransformerOptions& o) {
  const int64_t side = o.image_size / o.patch_size;
  return side * side;
}

std::shared_ptr<Conv2d> make_patch_embed(const VisionTransformerOptions& o) {
  return std::make_shared<Conv2d>(o.in_channels, o.hidden_dim, o.patch_size, o.patch_size);
}

// The forward of ViTEmbedding, and the first steps of VisionTransformer's.
Tensor embed(const VisionTransformerOptions& o, Conv2d& patch_embed, const Tensor& cls_token, const Tensor& pos_embed,
             const Tensor& images) {
  LOOM_CHECK(images.defined() && images.dim() == 4 && images.size(1) == o.in_channels &&
                 images.size(2) == o.image_size && images.size(3) == o.image_size,
             "VisionTransformer(image_size=", o.image_size, ", patch_size=", o.patch_size, "): expected images of "
             "shape [N, ", o.in_channels, ", ", o.image_size, ", ", o.image_size, "], got ",
             images.defined() ? detail::str(images.shape()) : "an undefined tensor",
             "; the positional embedding has one position per patch of that size");
  const int64_t n = images.size(0);
  Tensor patches = flatten(patch_embed(images), 2).transpose(1, 2);  // [N, D, h, w] -> [N, h*w, D]
  Tensor cls = cls_token.expand({n, 1, o.hidden_dim});
  return cat({cls, patches}, 1) + pos_embed;
}

}  // namespace

ViTEmbedding::ViTEmbedding(const VisionTransformerOptions& options_) : Cloneable("ViTEmbedding"), options(options_) {
  check_options(options);
  reset();
}

void ViTEmbedding::reset() {
  patch_embed = register_module("patch_embed", make_patch_embed(options));
  cls_token = register_parameter("cls_token", empty({1, 1, options.hidden_dim}));
  pos_embed = register_parameter("pos_embed", empty({1, 1 + patches_of(options), options.hidden_dim}));
  init::trunc_normal_(cls_token, 0.0, 0.02);
  init::trunc_normal_(pos_embed, 0.0, 0.02);
}

Tensor ViTEmbedding::forward(const Tensor& images) { return embed(options, *patch_embed, cls_token, pos_embed, images); }

Tensor ClassTokenPool::forward(const Tensor& tokens) {
  LOOM_CHECK(tokens.dim() == 3 && tokens.size(1) >= 1, "ClassTokenPool: expected tokens [N, L, D] with L >= 1, got ",
             tokens.shape());
  return select(tokens, 1, 0);
}

VisionTransformer::VisionTransformer(const VisionTransformerOptions& options_)
    : Cloneable("VisionTransformer"), options(options_) {
  check_options(options);
  reset();
}

void VisionTransformer::reset() {
  const VisionTransformerOptions& o = options;
  patch_embed = register_module("patch_embed", make_patch_embed(o));
  cls_token = register_parameter("cls_token", empty({1, 1, o.hidden_dim}));
  pos_embed = register_parameter("pos_embed", empty({1, 1 + patches_of(o), o.hidden_dim}));
  pos_drop = register_module("pos_drop", std::make_shared<Dropout>(o.dropout));
  blocks = register_module("blocks", std::make_shared<Sequential>());
  for (int64_t i = 0; i < o.num_layers; ++i)
    blocks->push_back(std::make_shared<TransformerEncoderLayer>(o.hidden_dim, o.num_heads, o.mlp_dim, o.dropout, "gelu",
                                                                o.layer_norm_eps, /*batch_first=*/true,
                                                                /*norm_first=*/true));
  norm = register_module("norm", std::make_shared<LayerNorm>(Shape{o.hidden_dim}, o.layer_norm_eps));
  head = register_module("head", std::make_shared<Linear>(o.hidden_dim, o.num_classes));
  init_weights();
}

void VisionTransformer::init_weights() {
  init::trunc_normal_(cls_token, 0.0, 0.02);
  init::trunc_normal_(pos_embed, 0.0, 0.02);
  apply([](Module& m) {  // apply, not modules(): reset() runs before a shared_ptr owns this model
    if (auto* linear = dynamic_cast<Linear*>(&m)) {
      init::trunc_normal_(linear->weight, 0.0, 0.02);
      if (linear->bias.defined()) init::zeros_(linear->bias);
    } else if (auto* ln = dynamic_cast<LayerNorm*>(&m)) {
      ln->reset_parameters();
    }
  });
}

Tensor VisionTransformer::forward(const Tensor& images) {
  Tensor x = (*pos_drop)(embed(options, *patch_embed, cls_token, pos_embed, images));
  x = (*norm)((*blocks)(x));
  return (*head)(select(x, 1, 0));
}

std::shared_ptr<Sequential> VisionTransformer::sequential() const {
  std::shared_ptr<ViTEmbedding> embedding;
  {
    init::NoInitGuard no_init;  // its own tensors are replaced by this model's right away
    embedding = std::make_shared<ViTEmbedding>(options);
  }
  // Registering an existing name replaces it: the view shares this model's conv and tensors.
  embedding->patch_embed = embedding->register_module("patch_embed", patch_embed);
  embedding->cls_token = embedding->register_parameter("cls_token", cls_token);
  embedding->pos_embed = embedding->register_parameter("pos_embed", pos_embed);
  auto seq = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{embedding, pos_drop});
  for (const auto& block : blocks->children()) seq->push_back(block);
  seq->push_back(norm);
  seq->push_back(std::make_shared<ClassTokenPool>());
  seq->push_back(head);
  seq->train(is_training());
  return seq;
}

int64_t VisionTransformer::num_patches() const { return patches_of(options); }

std::shared_ptr<VisionTransformer> vit_tiny(int64_t num_classes) {
  return std::make_shared<VisionTransformer>(VisionTransformerOptions{
      .num_layers = 12, .num_heads = 3, .hidden_dim = 192, .mlp_dim = 768, .num_classes = num_classes});
}

std::shared_ptr<VisionTransformer> vit_small(int64_t num_classes) {
  return std::make_shared<VisionTransformer>(VisionTransformerOptions{
      .num_layers = 12, .num_heads = 6, .hidden_dim = 384, .mlp_dim = 1536, .num_classes = num_classes});
}

}  // namespace loom::nn
