// A sharded checkpoint as one file and back: PyTorch's dcp_to_torch_save and
// torch_save_to_dcp (torch.distributed.checkpoint.format_utils), for loom's sets.
//
//   OrderedDict<Tensor> whole = consolidate(read_checkpoint_index(step_dir), false);  // the model, whole
//   safetensors::save_file(whole, "model.safetensors", {{"format", "pt"}});       // torch loads it
//   write_one_rank_set(safetensors::load_file("model.safetensors"), "out/step-00000000");
//
// consolidate assembles each logical tensor from its pieces through the same load plan a
// resume uses (load_plan.h): a tensor of its global shape is one wanted piece, filled from
// every saved piece. The model's tensors carry the single-process names, so the result is
// the file one process's nn::save writes (and its load_state_dict takes); the
// optimizer's state by name ("optim.*", Note [Optimizer state by name]) comes along only
// when asked for. A one-rank set written from a file loads under any layout through the
// same plan (every piece whole, rank 0's).
#pragma once

#include <string>

#include "nn/ordered_dict.h"                 // defines: OrderedDict
#include "parallel/checkpoint/load_plan.h"   // defines: CheckpointIndex

namespace loom::distributed::checkpoint {

// Every logical tensor of `index`, whole, in name order; the optimizer's ("optim.*") only
// `with_optimizer`. A loom::Error when the set does not cover one of them.
OrderedDict<Tensor> consolidate(const CheckpointIndex& index, bool with_optimizer);

// `tensors` as a complete sharded set of one rank at `step_dir` (its shard file, then the
// manifest: parallel/distributed_checkpoint.h), each tensor one whole piece. `metadata`
// goes into the shard file beside the pieces'.
void write_one_rank_set(const OrderedDict<Tensor>& tensors, const std::string& step_dir,
                        const safetensors::Metadata& metadata = {});

}  // namespace loom::distributed::checkpoint
