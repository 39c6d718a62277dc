// VisionTransformer (ViT, Dosovitskiy et al. 2020) for CIFAR-10: 32x32 images cut into
// 4x4 patches, so a sequence of 64 patch tokens plus a class token.
//
//   auto model = nn::vit_tiny(/*num_classes=*/10);   // 5,362,762 parameters
//   Tensor logits = (*model)(images);                // [N, 3, 32, 32] -> [N, 10]
//
//   x = patch_embed(images)                  Conv2d(3, D, kernel 4, stride 4): [N, D, 8, 8]
//   x = cat(cls_token, x as [N, 64, D]) + pos_embed                          [N, 65, D]
//   x = blocks(pos_drop(x))                  depth x pre-norm TransformerEncoderLayer (GELU)
//   logits = head(norm(x)[:, 0])             the class token's final features
//
// | model     | D (hidden_dim) | depth | heads | mlp_dim | parameters (10 classes) |
// |-----------|----------------|-------|-------|---------|-------------------------|
// | vit_tiny  | 192            | 12    | 3     | 768     | 5,362,762               |
// | vit_small | 384            | 12    | 6     | 1536    | 21,342,346              |
// Per block 12 D^2 + 13 D parameters (q, k, v, out_proj: 4 (D^2 + D); the MLP: 8 D^2 + 5 D;
// two LayerNorms: 4 D); around them the patch embedding (48 D + D), the class token (D),
// 65 D of positions, the final LayerNorm (2 D) and the head (10 D + 10).
//
// Names are timm's where a module is the same (patch_embed, cls_token, pos_embed, blocks.i,
// norm, head); a block is torch.nn.TransformerEncoderLayer (norm_first, GELU, batch_first),
// so its keys are PyTorch's: blocks.0.self_attn.out_proj.weight, blocks.0.linear1.weight,
// blocks.0.norm1.weight, ..., but for the input projections (Note [Separate q, k and v
// projections], nn/multihead_attention.h). LayerNorm eps is 1e-6, timm's.
//
// Initialisation is timm's (init_weights_vit_timm): every Linear weight (q, k, v, out_proj,
// the MLP, the head) trunc_normal_(std 0.02) with zero bias, cls_token and pos_embed
// trunc_normal_(std 0.02), LayerNorms 1 and 0, and the patch embedding Conv2d's PyTorch
// default. The positional embedding is a learned Parameter [1, 65, D], not an Embedding:
// every sample adds the same one.
#pragma once

#include <memory>
#include <set>
#include <string>

#include "nn/activation.h"     // defines: Dropout
#include "nn/container.h"      // defines: Sequential
#include "nn/conv.h"           // defines: Conv2d
#include "nn/linear.h"         // defines: Linear
#include "nn/normalization.h"  // defines: LayerNorm
#include "nn/transformer.h"    // defines: TransformerEncoderLayer

namespace loom::nn {

// torchvision's argument names (models/vision_transformer.py).
struct VisionTransformerOptions {
  int64_t image_size = 32;
  int64_t patch_size = 4;
  int64_t num_layers = 12;
  int64_t num_heads = 3;
  int64_t hidden_dim = 192;
  int64_t mlp_dim = 768;
  double dropout = 0.0;  // after the positional embedding, on attention weights and in every residual branch
  int64_t num_classes = 10;
  int64_t in_channels = 3;
  double layer_norm_eps = 1e-6;
};

// images -> class token + patch tokens with positions: ViT's first stage in sequential().
// Owns (or, in a sequential() view, shares) patch_embed, cls_token and pos_embed.
class ViTEmbedding : public Cloneable<ViTEmbedding> {
 public:
  explicit ViTEmbedding(const VisionTransformerOptions& options);
  void reset() override;
  Tensor forward(const Tensor& images) override;

  VisionTransformerOptions options;
  std::shared_ptr<Conv2d> patch_embed;
  Tensor cls_token, pos_embed;  // [1, 1, D], [1, 1 + patches, D]
};

// [N, L, D] -> [N, D]: token 0, the class token, as the classifier's input.
class ClassTokenPool : public Cloneable<ClassTokenPool> {
 public:
  ClassTokenPool() : Cloneable("ClassTokenPool") {}
  void reset() override {}
  Tensor forward(const Tensor& tokens) override;
};

class VisionTransformer : public Cloneable<VisionTransformer> {
 public:
  explicit VisionTransformer(const VisionTransformerOptions& options = {});
  void reset() override;
  // timm's initialisation (see above); reset() calls it.
  void init_weights();
  Tensor forward(const Tensor& images) override;
  // The same forward as a flat Sequential sharing this model's modules and parameters:
  // ViTEmbedding (patch_embed, cls_token, pos_embed), pos_drop, the blocks one by one,
  // norm, ClassTokenPool, head. Pipelines cut it into stages of blocks and FSDP wraps each
  // block as a unit; its own state_dict keys are positional ("1.self_attn.q_proj.weight"),
  // so checkpoint through the VisionTransformer.
  std::shared_ptr<Sequential> sequential() const override;
  int64_t num_patches() const;
  // Parameters to exempt from weight decay besides biases and norms: {"cls_token",
  // "pos_embed"}, timm's model.no_weight_decay() (optim::param_groups_weight_decay).
  std::set<std::string> no_weight_decay() const { return {"cls_token", "pos_embed"}; }

  VisionTransformerOptions options;
  std::shared_ptr<Conv2d> patch_embed;
  Tensor cls_token, pos_embed;
  std::shared_ptr<Dropout> pos_drop;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> head;
};

// ViT-Ti/4 and ViT-S/4 for 32x32 images (DeiT's tiny and small widths).
std::shared_ptr<VisionTransformer> vit_tiny(int64_t num_classes = 10);
std::shared_ptr<VisionTransformer> vit_small(int64_t num_classes = 10);

}  // namespace loom::nn
