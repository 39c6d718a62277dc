// Embedding: a lookup table of vectors, one row per index, as torch.nn.Embedding.
//
//   auto embed = std::make_shared<nn::Embedding>(1000, 192);   // weight [1000, 192], N(0, 1)
//   Tensor x = (*embed)(token_ids);                            // int64 [N, L] -> [N, L, 192]
//
// The gradient of a row is the sum of the gradients of every position that looked it up
// (index_select's backward, an index_add). A positional embedding that is one learned
// tensor added to every sample (ViT's pos_embed) is a plain Parameter instead: see
// nn/vision_transformer.h.
#pragma once

#include "nn/module.h"  // defines: Module, Cloneable

namespace loom::nn {

class Embedding : public Cloneable<Embedding> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  void reset() override;
  void reset_parameters();  // weight ~ N(0, 1), as PyTorch
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  int64_t num_embeddings, embedding_dim;
  Tensor weight;  // [num_embeddings, embedding_dim]
};

}  // namespace loom::nn
