#include "parallel/tensor/vit_plan.h"

#include "core/error.h"  // defines: LOOM_CHECK

namespace loom::distributed {

ParallelizePlan vit_tp_plan(const nn::VisionTransformer& model, int tp) {
  const int64_t heads = model.options.num_heads;
  LOOM_CHECK(tp >= 1 && heads % tp == 0, "vit_tp_plan: tensor parallelism over ", tp, " ranks splits attention by "
             "whole heads, and ", tp, " does not divide the model's ", heads, " heads (Note [Heads split whole]); use "
             "a tp degree that divides ", heads);
  return {
      // f once for q, k and v: Note [One f for q, k and v].
      {"blocks.*.self_attn", PrepareModuleInput(Replicate(), Replicate(), /*reduce_grad=*/true)},
      {"blocks.*.self_attn.q_proj", ColwiseParallel({.reduce_input_grad = false})},
      {"blocks.*.self_attn.k_proj", ColwiseParallel({.reduce_input_grad = false})},
      {"blocks.*.self_attn.v_proj", ColwiseParallel({.reduce_input_grad = false})},
      {"blocks.*.self_attn.out_proj", RowwiseParallel()},
      {"blocks.*.linear1", ColwiseParallel()},
      {"blocks.*.linear2", RowwiseParallel()},
  };
}

}  // namespace loom::distributed
