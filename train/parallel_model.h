// ParallelModel: the model as parallelize() cut and wrapped it on this rank, and the one
// interface the rest of the trainer uses on it, whatever the parallelisms:
//
//   ParallelModel parallel = parallelize(model, dims, mesh, world, config, device, criterion);
//   parallel.module()(images);                    // forward (no pipeline)
//   parallel.pipeline()->step(images, labels);    // forward and backward (a pipeline)
//   build_optimizer(parallel.module().parameters(), ...);   // what this rank steps
//   parallel.full_state_dict();                   // the whole model on rank 0: --save, full checkpoints
//   parallel.local_state();                       // this rank's tensors as boxes of the model's: sharded ones
//   parallel.grad_norm_terms(stepped);            // what this rank adds to the gradient norm
//
// The trainer's loop, the Checkpointer and the GradClipper ask it these questions and
// never which wrappers it holds (torchtitan's model_parts with
// torch.distributed.checkpoint.state_dict's get_model_state_dict in one object).
//
// Note [Model parts]
// A rank trains one or more parts of the model: the whole model, or under --pp the
// virtual stages of its pipeline stage (one, or --virtual-stages of them). Every part went
// through the same steps (parallelize.h): activation-checkpoint marks and the
// tensor-parallel split are made on the plain model in place, so every cut keeps them;
// then each part is wrapped alike, by FSDP (--dp-shard, apply_fsdp) or DDP (--dp-replicate).
// A part's tensors are the plain model's own objects (FSDP1's flat shards and FSDP2's
// local rows aside, which fsdp_param_pieces maps back), so the plain model's names name
// everything a rank holds, and a checkpoint written under one cut loads under any other.
// What differs between strategies is answered here, part by part, in one place: how to
// make the whole model's state (gather FSDP's shards, share the stages, gather the tp
// splits), which boxes of which tensors a rank holds, and whose gradients a rank counts.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"                                  // defines: Module
#include "parallel/checkpoint/fsdp_state.h"             // defines: ParamPieces
#include "parallel/checkpoint/sharded_state.h"          // defines: ShardedState
#include "parallel/device_mesh.h"                       // defines: DeviceMesh
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel
#include "parallel/parallel_dims.h"                     // defines: ParallelDims
#include "parallel/pipeline/pipeline_stage.h"           // defines: PipelineStage
#include "parallel/pipeline/stage_sharding.h"           // defines: StageShards
#include "parallel/pipeline/step_result.h"              // defines: PipelineSchedule
#include "parallel/tensor/parallel_style.h"             // defines: StatePlacements
#include "train/optimizer.h"                            // defines: BuiltOptimizer

namespace loom::training {

// One part of the model on this rank (Note [Model parts]).
struct ModelPart {
  std::shared_ptr<nn::Module> module;                    // what runs it: its wrapper, or its own layers
  std::shared_ptr<fsdp::FullyShardedDataParallel> fsdp;  // --dp-shard: the wrapper is FSDP, holding shards
};

// This rank's tensors as pieces of the plain model's (Note [Every layout is a set of boxes],
// parallel/checkpoint/chunks.h), and, among them, each tensor the optimizer steps.
struct LocalState {
  distributed::checkpoint::ShardedState model;
  distributed::checkpoint::ParamPieces params;
};

// What a rank adds to a whole-model gradient norm (Note [Whose gradients a rank adds to the
// norm], grad_clipping.h): the tensors it counts, and the groups the sum runs over.
struct GradNormTerms {
  std::vector<Tensor> counted;
  std::vector<std::shared_ptr<distributed::Communicator>> sum_over;
};

class ParallelModel {
 public:
  // Nothing applied yet: the model is what the loop calls, and its one part. `mesh` (null
  // in one process) outlives this object.
  ParallelModel(std::shared_ptr<nn::Module> model, const distributed::ParallelDims& dims,
                const distributed::DeviceMesh* mesh);

  // The plain model: its names name every tensor a rank holds.
  nn::Module& model() const { return *model_; }
  const std::shared_ptr<nn::Module>& model_ptr() const { return model_; }
  // What the loop calls, and whose parameters() this rank's optimizer steps: the model,
  // its wrapper (DataParallel, DDP, FSDP, ModelParallel, Pipeline) or --pp's stage.
  nn::Module& module() const { return *module_; }
  // Under a pipeline (--pp, --mode pipeline): what runs forward and backward of a batch;
  // else null.
  parallel::pipeline::PipelineSchedule* pipeline() const { return pipeline_.get(); }
  const std::vector<ModelPart>& parts() const { return parts_; }
  // --tp: how each split tensor of the model is cut over the "tp" ranks; empty without.
  const distributed::StatePlacements& tp_placements() const { return tp_placements_; }

  // The module to evaluate: the module the loop calls or, under --pp, the whole model
  // made whole on every rank (a collective over the pipeline's groups).
  nn::Module& for_evaluation();

  // The whole model's state under its own names, as one process would save it: FSDP's
  // shards gathered, a pipeline's stages shared, tensor-parallel splits gathered. A
  // collective; complete on rank 0 (elsewhere possibly partial or empty).
  OrderedDict<Tensor> full_state_dict();
  // The inverse, from a whole state (every rank passes the same): each part takes its
  // tensors, FSDP its shards of them. Not under --pp or --tp (Checkpointer refuses
  // full checkpoints there).
  void load_full_state_dict(const OrderedDict<Tensor>& state);
  // The optimizer's whole state as one process's would be (FSDP's and ZeRO-1's
  // consolidated), on rank 0 (`main`); empty elsewhere. A collective.
  OrderedDict<Tensor> full_optim_state_dict(const BuiltOptimizer& optimizer, bool main);
  void load_full_optim_state_dict(const BuiltOptimizer& optimizer, const OrderedDict<Tensor>& state);

  // See LocalState; which of the ranks that hold a tensor alike writes it is marked.
  LocalState local_state() const;
  // For build_optimizer: the model's parameters in each tensor this rank steps (the
  // parameter itself, else those local_state() finds pieces of in it, with their whole shapes).
  ModelParametersOf model_parameters_of() const;
  // "pp=1 dp_replicate=1 dp_shard=2 tp=1 (world 2), FSDP2 per-parameter shards": the
  // degrees and the FSDP layout, which together fix every rank's boxes.
  std::string layout_name() const;

  // Of `stepped` (the optimizer's parameters), what this rank adds to the norm, and the
  // mesh groups holding different parts (pp, dp_shard where it shards, tp). A
  // loom::Error for FSDP1's flat shards over tensor-parallel ones.
  GradNormTerms grad_norm_terms(const std::vector<Tensor>& stepped) const;

  // ---- for parallelize() as it cuts and wraps ----
  // In one process (--mode pipeline): the whole model's part is `pipeline` (owned with it).
  void set_pipeline(std::shared_ptr<parallel::pipeline::PipelineSchedule> pipeline) { pipeline_ = std::move(pipeline); }
  void set_tp_placements(distributed::StatePlacements placements) { tp_placements_ = std::move(placements); }
  // The whole model wrapped as one part (no pipeline).
  void set_whole_part(ModelPart part);
  // --pp: this rank's stage, its virtual stages as parts (FSDP of each under --dp-shard,
  // in local_virtual_stages() order, null where one has nothing to train), and the copy
  // of the model that gathering fills when the stage's own layers hold shards.
  void set_stage(std::shared_ptr<parallel::pipeline::PipelineStage> stage, parallel::pipeline::StageShards shards,
                 std::shared_ptr<nn::Module> whole_copy);

 private:
  // --pp: every rank's `whole_` made the whole model (each stage's weights from its owner).
  void gather_whole();
  // FSDP wrapping the whole model (--dp-shard without --pp), else null.
  fsdp::FullyShardedDataParallel* whole_model_fsdp() const;

  std::shared_ptr<nn::Module> model_, module_;
  std::shared_ptr<parallel::pipeline::PipelineSchedule> pipeline_;  // module_ itself, seen as a pipeline
  std::vector<ModelPart> parts_;
  distributed::StatePlacements tp_placements_;
  distributed::ParallelDims dims_;
  const distributed::DeviceMesh* mesh_;
  std::shared_ptr<parallel::pipeline::PipelineStage> stage_;  // --pp
  parallel::pipeline::StageShards stage_shards_;               // --pp with --dp-shard
  std::shared_ptr<nn::Module> whole_;  // what holds the whole model after gather_whole()
};

}  // namespace loom::training
