// The tensor-parallel plan of a Vision Transformer: Megatron's attention and MLP splits,
// on loom's TransformerEncoderLayer (nn/transformer.h).
//
//   parallelize_module(*vit, tp, vit_tp_plan(*vit, tp->size()));
//
// In each block, with x [N, L, D] whole (Replicate()) on every rank:
//
//   attention:  q_proj, k_proj, v_proj  ColwiseParallel   each rank num_heads / tp heads (f on x)
//               attention of those heads, on this rank alone
//               out_proj                RowwiseParallel   partial sums -g-> Replicate(), + bias once
//   MLP:        linear1                 ColwiseParallel   each rank mlp_dim / tp features (f)
//               GELU on them
//               linear2                 RowwiseParallel   partial sums -g-> Replicate(), + bias once
//
// LayerNorms, residuals, the patch embedding, tokens, the final norm and the head stay
// whole: every rank computes them alike from the reduced activations. Each block costs two
// all-reduces of [N, L, D] forward (out_proj's and linear2's sums) and two backward (the
// gradients of the two normalised inputs), as Megatron-LM's.
//
// Note [Heads split whole]
// MultiheadAttention takes its head count from the width its projections produce (Note
// [Heads from the projection width], nn/multihead_attention.h), so a column split of q, k
// and v gives each rank whole heads only if the rows cut at head boundaries: tp must divide
// num_heads (vit_tiny's 3 heads: tp 1 or 3). The MLP's features may cut unevenly, as
// torch.chunk.
#pragma once

#include "nn/vision_transformer.h"               // defines: VisionTransformer
#include "parallel/tensor/parallelize_module.h"  // defines: ParallelizePlan

namespace loom::distributed {

// The plan above for `tp` ranks; an error when tp does not divide the heads.
ParallelizePlan vit_tp_plan(const nn::VisionTransformer& model, int tp);

}  // namespace loom::distributed
