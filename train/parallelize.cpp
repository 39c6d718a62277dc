#include "train/parallelize.h"

#include <omp.h>  // defines: omp_get_max_threads, omp_set_num_threads (balancing a pipeline's stages)

#include <algorithm>  // defines: std::max, std::min
#include <cstdio>
#include <set>        // defines: std::set (the block types --activation-checkpoint marks)

#include "core/factory.h"                            // defines: zeros (the balance's sample batch)
#include "nn/checkpoint.h"                           // defines: apply_activation_checkpointing (--activation-checkpoint)
#include "nn/models.h"                               // defines: sequential_view (the layers to cut or wrap)
#include "parallel/data_parallel.h"                  // defines: DataParallel
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DistributedDataParallel
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel
#include "parallel/comm/process_group.h"              // defines: default_group (the balance agreed by the world)
#include "parallel/model_parallel.h"                 // defines: ModelParallel, choose_balance
#include "parallel/pipeline/pipeline.h"              // defines: Pipeline
#include "parallel/pipeline/pipeline_processes.h"    // defines: apply_pipeline_processes
#include "parallel/pipeline/stage_replicas.h"        // defines: replicate_stage (--pp with --dp-replicate)
#include "parallel/pipeline/stage_sharding.h"        // defines: shard_stage, gather_stage_weights (--pp with --dp-shard)
#include "parallel/sync_batch_norm.h"                // defines: convert_sync_batchnorm
#include "parallel/tensor/parallelize_module.h"       // defines: parallelize_module (--tp)
#include "train/model_spec.h"                          // defines: model_spec (blocks, --tp's plan)

namespace loom::training {

// `count` devices of `first`'s type from `first` on: cpu:0, cpu:1, ... or cuda:0, cuda:1, ...
static std::vector<Device> consecutive_devices(Device first, int64_t count) {
  std::vector<Device> devices;
  for (int64_t i = 0; i < count; ++i) devices.emplace_back(first.type, first.index + static_cast<int>(i));
  return devices;
}

// --mode dp: DataParallel over dims.dp_devices devices of --device's type, starting at the
// model's (cpu:0, cpu:1, ... are CPU virtual devices: one thread each in forward).
static std::shared_ptr<nn::Module> apply_data_parallel(std::shared_ptr<nn::Module> model, int devices,
                                                       const TrainConfig& config, Device device) {
  auto dp = std::make_shared<parallel::DataParallel>(model, consecutive_devices(device, devices));
  if (config.metrics.progress) std::fprintf(stderr, "DataParallel over %s\n", dp->extra_repr().c_str());
  return dp;
}

// A pass's worth of inputs to balance the layers with: a micro-batch (pipeline) or a batch of
// at most 32 CIFAR images. Zeros: the cost model reads only its shape, and timing does not
// depend on the values.
static Tensor balance_sample(const TrainConfig& config, const distributed::ParallelDims& dims, Device device) {
  const bool layer_wise = dims.mp_enabled() && !dims.mp_microbatched;
  const int64_t per_pass =
      layer_wise ? std::min<int64_t>(config.data.batch_size, 32)
                 : (config.data.batch_size + config.parallel.microbatches - 1) / config.parallel.microbatches;
  return zeros({std::max<int64_t>(per_pass, 1), 3, 32, 32}, TensorOptions().device(device));
}

// --balance N,N,...: one positive count per virtual stage (`chunks`: stages × --virtual-stages),
// adding up to the model's `layers`; checked here, where the layers are known, so that the
// error names the flags (the library's own check names its arguments).
static void check_balance_flag(const TrainConfig& config, int64_t chunks, int64_t layers) {
  if (config.parallel.balance.empty()) return;
  int64_t total = 0;
  bool positive = true;
  for (int64_t b : config.parallel.balance) total += b, positive = positive && b >= 1;
  LOOM_CHECK(static_cast<int64_t>(config.parallel.balance.size()) == chunks && total == layers && positive,
             "--balance: expected ", chunks,
             " positive layer counts (one per virtual stage: stages × --virtual-stages) adding up to the "
             "Sequential's length, ",
             layers, " layers; got ", config.parallel.balance.size(), " entries adding up to ", total);
}

// "pipeline balance: 4,3,4,3 (by cost)", once per run.
static void print_balance(const std::vector<int64_t>& balance, const TrainConfig& config) {
  if (config.metrics.progress)
    std::fprintf(stderr, "pipeline balance: %s (%s)\n", parallel::balance_str(balance).c_str(),
                 config.parallel.balance.empty() ? ("by " + config.parallel.balance_by).c_str() : "given");
}

// The in-process stages: the module the loop calls and, when they run micro-batches, the
// same object as the Pipeline whose step() the loop calls instead.
struct InProcessStages {
  std::shared_ptr<parallel::ModelParallel> module;
  std::shared_ptr<parallel::pipeline::Pipeline> pipeline;  // null: layer-wise (ModelParallel)
};

// --mode mp | pipeline: the model as a Sequential (sequential_view) cut into dims.mp_stages
// stages on consecutive devices, balanced by --balance (Note [Stage balance]), sharing the
// model's layers, which move to their devices. Layer-wise (mp): one batch at a time;
// micro-batched (pipeline): --microbatches micro-batches under --pipeline-schedule, with
// --pipeline-checkpoint's micro-batches recomputed in their backward.
static InProcessStages apply_model_parallel(nn::Module& model, const distributed::ParallelDims& dims,
                                            const TrainConfig& config, Device device, nn::CrossEntropyLoss& criterion) {
  const int64_t count = dims.mp_stages;
  const std::vector<Device> devices = consecutive_devices(device, count);
  auto layers = nn::sequential_view(model);  // the model's layers in order, to cut
  const int64_t model_chunks = count * config.parallel.virtual_stages;  // interleaved_1f1b: V per stage
  LOOM_CHECK(count >= 1 && model_chunks <= static_cast<int64_t>(layers->size()), "--mp-devices ", count,
             " x --virtual-stages ", config.parallel.virtual_stages, ": the model has ", layers->size(),
             " layers to cut into "
             "chunks (one or more each), so use at most ",
             layers->size(), " chunks");
  // Measured (--balance time) as the stages will run: on each stage's share of the threads.
  check_balance_flag(config, model_chunks, static_cast<int64_t>(layers->size()));
  const int threads = omp_get_max_threads();
  if (dims.mp_microbatched) omp_set_num_threads(std::max(1, threads / static_cast<int>(count)));
  const std::vector<int64_t> balance = parallel::choose_balance(
      *layers, config.parallel.balance, config.parallel.balance_by, model_chunks, balance_sample(config, dims, device));
  omp_set_num_threads(threads);
  print_balance(balance, config);
  InProcessStages stages;
  if (dims.mp_microbatched) {
    stages.pipeline = std::make_shared<parallel::pipeline::Pipeline>(
        layers, devices, balance, config.parallel.microbatches, config.parallel.pipeline_schedule,
        [&criterion](const Tensor& out, const Tensor& target) { return criterion(out, target); },
        config.parallel.pipeline_checkpoint);
    stages.module = stages.pipeline;
  } else {
    stages.module = std::make_shared<parallel::ModelParallel>(layers, devices, balance);
  }
  if (config.metrics.progress)
    std::fprintf(stderr, "%s: %s\n", dims.mp_microbatched ? "pipeline" : "mp", stages.module->extra_repr().c_str());
  return stages;
}

std::shared_ptr<parallel::pipeline::PipelineStage> apply_pipeline(nn::Module& model,
                                                                  std::shared_ptr<distributed::Communicator> pp_group,
                                                                  std::shared_ptr<distributed::Communicator> world,
                                                                  const distributed::ParallelDims& dims,
                                                                  const TrainConfig& config, Device device,
                                                                  nn::CrossEntropyLoss& criterion) {
  // The balance is agreed over the world: under pp x dp the replicas of a stage must cut
  // alike too (Note [One balance for every rank]).
  auto layers = nn::sequential_view(model);
  check_balance_flag(config, pp_group->size() * config.parallel.virtual_stages, static_cast<int64_t>(layers->size()));
  auto stage = parallel::pipeline::apply_pipeline_processes(
      layers, std::move(pp_group), device,
      {.balance = config.parallel.balance,
       .balance_by = config.parallel.balance_by,
       .n_microbatches = config.parallel.microbatches,
       .schedule = config.parallel.pipeline_schedule,
       .virtual_stages = config.parallel.virtual_stages,
       .checkpoint = config.parallel.pipeline_checkpoint},
      [&criterion](const Tensor& out, const Tensor& target) { return criterion(out, target); },
      balance_sample(config, dims, device), world);
  if (world->rank() == 0) {  // once per run, not once per pipeline
    print_balance(stage->balance(), config);
    if (config.metrics.progress) std::fprintf(stderr, "pipeline of processes: %s\n", stage->extra_repr().c_str());
  }
  return stage;
}

std::vector<std::string> apply_ac(nn::Module& model, const TrainConfig& config, bool log) {
  if (config.model.activation_checkpoint == "none") return {};
  const std::set<std::string> blocks = model_spec(config.model.name).block_types;
  const int64_t every = config.model.activation_checkpoint == "selective" ? config.model.selective_ac_option : 1;
  int64_t seen = 0;
  std::vector<std::string> marked = nn::apply_activation_checkpointing(
      model, [&](const std::string&, nn::Module& m) { return blocks.count(m.type_name()) && seen++ % every == 0; });
  LOOM_CHECK(!marked.empty(), "--activation-checkpoint ", config.model.activation_checkpoint,
             " checkpoints residual blocks "
             "and encoder layers, and the ",
             model.type_name(), " has none");
  if (config.metrics.progress && log)
    std::fprintf(stderr, "activation checkpointing: %zu blocks recompute their activations in backward\n", marked.size());
  return marked;
}

distributed::StatePlacements apply_tp(nn::Module& model, std::shared_ptr<distributed::Communicator> tp_group,
                                      const TrainConfig& config, bool log) {
  const int tp = tp_group->size();
  const ModelSpec& spec = model_spec(config.model.name);
  LOOM_CHECK(spec.tp_plan != nullptr, "--tp splits a model by its family's plan, and the ", spec.family,
             " family (--model ", config.model.name, ") has none (ModelSpec::tp_plan, train/model_spec.h)");
  distributed::StatePlacements placements =
      distributed::parallelize_module(model, std::move(tp_group), spec.tp_plan(model, tp));
  if (config.metrics.progress && log)
    std::fprintf(stderr, "tensor parallel over %d ranks: %zu tensors split\n", tp, placements.size());
  return placements;
}

ddp::DDPOptions ddp_options(const TrainConfig& config) {
  ddp::DDPOptions options;
  options.bucket_cap_mb = config.parallel.bucket_cap_mb;
  // .grad() is a view into the reduced bucket: finalize then has nothing to copy back, a
  // 43 MiB copy saved at the end of every ResNet18 backward, where nothing overlaps it,
  // and between steps the gradients take no memory of their own. (During backward each
  // fresh gradient still lives on its own until the hook copies it into its slot, as in
  // PyTorch: zero_grad() drops them.) The loop only reads gradients, which is all this
  // option asks of it.
  options.gradient_as_bucket_view = true;
  return options;
}

std::shared_ptr<nn::Module> apply_ddp(std::shared_ptr<nn::Module> model,
                                      std::shared_ptr<distributed::Communicator> dp_group, const TrainConfig& config) {
  return std::make_shared<ddp::DistributedDataParallel>(model, std::move(dp_group), ddp_options(config));
}

fsdp::FSDPOptions fsdp_options(const distributed::ParallelDims& dims, const TrainConfig& config) {
  fsdp::ShardingStrategy strategy = fsdp::parse_sharding_strategy(config.parallel.sharding_strategy);
  if (dims.dp_replicate_enabled()) strategy = fsdp::ShardingStrategy::HYBRID_SHARD;  // shards within, replicas across
  else if (strategy == fsdp::ShardingStrategy::HYBRID_SHARD) strategy = fsdp::ShardingStrategy::FULL_SHARD;  // one replica
  fsdp::FSDPOptions options{.sharding_strategy = strategy,
                            .auto_wrap_policy = model_spec(config.model.name).block_policy(),
                            .per_parameter_sharding = config.parallel.fsdp_layout == "per_parameter"};
  if (config.parallel.reshard_after_forward != "default")
    options.reshard_after_forward = config.parallel.reshard_after_forward == "always";
  return options;
}

std::shared_ptr<fsdp::FullyShardedDataParallel> apply_fsdp(std::shared_ptr<nn::Module> part,
                                                           const distributed::DeviceMesh& mesh,
                                                           fsdp::FSDPOptions options) {
  if (options.sharding_strategy == fsdp::ShardingStrategy::HYBRID_SHARD)
    return std::make_shared<fsdp::FullyShardedDataParallel>(
        std::move(part), std::pair{mesh.group("dp_shard"), mesh.group("dp_replicate")}, std::move(options));
  return std::make_shared<fsdp::FullyShardedDataParallel>(std::move(part), mesh.group("dp_shard"), std::move(options));
}

// --pp with --dp-shard: FSDP on each of the stage's virtual stages over "dp_shard" (HSDP:
// and across "dp_replicate"); parameters stay gathered over a step's micro-batches and
// gradients are reduce-scattered once per chunk (Note [FSDP under a pipeline]). The ranks
// evaluate and save a copy of the model that gather_stage_weights fills.
static void shard_pipeline_stage(ParallelModel& out, std::shared_ptr<parallel::pipeline::PipelineStage> stage,
                                 const distributed::ParallelDims& dims, const distributed::DeviceMesh& mesh,
                                 const TrainConfig& config) {
  auto copy = out.model().clone();
  // Each virtual stage through apply_fsdp, as the whole model is without --pp; shard_stage
  // adjusts the options for a pipeline first (Note [FSDP under a pipeline]).
  const parallel::pipeline::StageShards shards = parallel::pipeline::shard_stage(
      *stage, fsdp_options(dims, config), [&](std::shared_ptr<nn::Module> part, fsdp::FSDPOptions options) {
        return apply_fsdp(std::move(part), mesh, std::move(options));
      });
  out.set_stage(std::move(stage), shards, std::move(copy));
}

ParallelModel parallelize(std::shared_ptr<nn::Module> model, const distributed::ParallelDims& dims,
                          const distributed::DeviceMesh* mesh, std::shared_ptr<distributed::Communicator> world,
                          const TrainConfig& config, Device device, nn::CrossEntropyLoss& criterion) {
  ParallelModel out(model, dims, mesh);
  const bool log = mesh == nullptr || mesh->rank() == 0;  // set-up lines once per run, not once per rank
  apply_ac(*model, config, log);  // first: marks in place, which every cut and wrapper below keeps
  if (dims.dp_devices_enabled()) {  // in one process, over several devices
    out.set_whole_part({apply_data_parallel(model, dims.dp_devices, config, device), nullptr});
    return out;
  }
  if (dims.mp_enabled()) {
    InProcessStages stages = apply_model_parallel(*model, dims, config, device, criterion);
    out.set_whole_part({stages.module, nullptr});
    out.set_pipeline(stages.pipeline);  // null: layer-wise
    return out;
  }
  if (mesh == nullptr) return out;  // one process, one device
  // Across processes. SyncBatchNorm converts the model before anything cuts or wraps it,
  // over the "batch" ranks: every data-parallel rank of the model, or of a stage.
  LOOM_CHECK(!config.parallel.sync_bn || dims.dp_enabled(),
             "--sync-bn synchronises BatchNorm statistics over the "
             "data-parallel ranks, and this run has none (",
             dims.str(), "); drop --sync-bn");
  if (config.parallel.sync_bn) nn::convert_sync_batchnorm(model, mesh->group("batch"));
  if (dims.pp_enabled()) {  // the pipeline split first; then each stage's parts
    auto stage = apply_pipeline(*model, mesh->group("pp"), world, dims, config, device, criterion);
    // The stage runs the model's own layers, so splitting them splits the stage's.
    if (dims.tp_enabled()) out.set_tp_placements(apply_tp(*model, mesh->group("tp"), config, log));
    if (dims.dp_shard_enabled()) {
      shard_pipeline_stage(out, stage, dims, *mesh, config);
      return out;
    }
    if (dims.dp_replicate_enabled())
      parallel::pipeline::replicate_stage(*stage, mesh->group("dp_replicate"), ddp_options(config));
    out.set_stage(stage, {}, nullptr);  // its step: this rank's stage; the loss on every rank
    return out;
  }
  if (dims.tp_enabled()) out.set_tp_placements(apply_tp(*model, mesh->group("tp"), config, log));
  if (dims.dp_shard_enabled()) {  // FSDP over each rank's tp shards: 2-D, as FSDP2 on a DTensor model
    // As torchtitan's apply_fsdp: the last block stays gathered from its forward to its
    // backward, beside the head (Note [Which units stay gathered], parallel/fsdp/runtime.cpp).
    // (Under --pp the schedule, not the unit order, decides when a unit's backward comes:
    // there a stage's units stay gathered through the step anyway.)
    fsdp::FSDPOptions options = fsdp_options(dims, config);
    options.keep_last_gathered = 2;
    auto fsdp = apply_fsdp(model, *mesh, std::move(options));
    out.set_whole_part({fsdp, fsdp});
  } else if (dims.dp_replicate_enabled()) {
    out.set_whole_part({apply_ddp(model, mesh->group("dp_replicate"), config), nullptr});
  }
  return out;
}

}  // namespace loom::training
