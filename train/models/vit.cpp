// The Vision Transformers (nn/vision_transformer.h) as the trainer sees them: 4x4 patches
// of 32x32 images, timm's weight-decay exemptions.
#include "nn/models.h"                // defines: make_model
#include "nn/vision_transformer.h"    // defines: VisionTransformer
#include "parallel/tensor/vit_plan.h"  // defines: vit_tp_plan
#include "train/model_spec.h"

namespace loom::training {

ModelSpec vit_spec() {
  return {
      .family = "vit",
      .names = {"vit_tiny", "vit_small"},
      .build = [](const std::string& name, int64_t num_classes) { return nn::make_model(name, {.num_classes = num_classes}); },
      // Encoder layers: units of FSDP and of activation checkpointing.
      .block_types = {"TransformerEncoderLayer"},
      // Attention by heads, the MLP by features.
      .tp_plan = for_model<nn::VisionTransformer>(
          [](const nn::VisionTransformer& m, int tp) { return distributed::vit_tp_plan(m, tp); }),
      .no_weight_decay = for_model<nn::VisionTransformer>([](const nn::VisionTransformer& m) { return m.no_weight_decay(); }),
  };
}

}  // namespace loom::training
