#include "examples/train/parallelize.h"

#include <omp.h>  // defines: omp_get_max_threads, omp_set_num_threads (balancing a pipeline's stages)

#include <algorithm>  // defines: std::count, std::find (the mesh's dimensions)
#include <cstdio>

#include "core/factory.h"                            // defines: zeros (the balance's sample batch)
#include "cuda/device.h"                             // defines: cuda::device_count (--mode dp's default)
#include "nn/resnet.h"                               // defines: ResNet::sequential
#include "parallel/data_parallel.h"                  // defines: DataParallel
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DistributedDataParallel
#include "parallel/fsdp/fully_sharded_data_parallel.h"  // defines: FullyShardedDataParallel
#include "parallel/comm/process_group.h"              // defines: default_group (the balance agreed by the world)
#include "parallel/model_parallel.h"                 // defines: ModelParallel, choose_balance
#include "parallel/pipeline/pipeline.h"              // defines: Pipeline
#include "parallel/pipeline/pipeline_processes.h"    // defines: apply_pipeline_processes
#include "parallel/pipeline/stage_replicas.h"        // defines: replicate_stage (--mode ddp --pp)
#include "parallel/sync_batch_norm.h"                // defines: convert_sync_batchnorm

namespace loom::examples {

// `count` devices of `first`'s type from `first` on: cpu:0, cpu:1, ... or cuda:0, cuda:1, ...
static std::vector<Device> consecutive_devices(Device first, int64_t count) {
  std::vector<Device> devices;
  for (int64_t i = 0; i < count; ++i) devices.emplace_back(first.type, first.index + static_cast<int>(i));
  return devices;
}

std::shared_ptr<nn::Module> apply_data_parallel(std::shared_ptr<nn::Module> model, const TrainConfig& config,
                                                Device device) {
  const int64_t count = config.dp_devices > 0 ? config.dp_devices : device.is_cuda() ? cuda::device_count() : 2;
  auto dp = std::make_shared<parallel::DataParallel>(model, consecutive_devices(device, count));
  if (config.progress) std::fprintf(stderr, "DataParallel over %s\n", dp->extra_repr().c_str());
  return dp;
}

// A pass's worth of inputs to balance the layers with: a micro-batch (pipeline) or a batch of
// at most 32. Zeros: the cost model reads only its shape, and timing does not depend on
// the values.
static Tensor balance_sample(const nn::ResNet& resnet, const TrainConfig& config, Device device) {
  const int64_t per_pass = config.mode == "pipeline" ? (config.batch_size + config.chunks - 1) / config.chunks
                                                     : std::min<int64_t>(config.batch_size, 32);
  return zeros({std::max<int64_t>(per_pass, 1), resnet.in_channels, 32, 32}, TensorOptions().device(device));
}

// "pipeline balance: 4,3,4,3 (by cost)", once per run.
static void print_balance(const std::vector<int64_t>& balance, const TrainConfig& config) {
  if (config.progress)
    std::fprintf(stderr, "pipeline balance: %s (%s)\n", parallel::balance_str(balance).c_str(),
                 config.balance.empty() ? ("by " + config.balance_by).c_str() : "given");
}

// The stages are balanced by --balance (Note [Stage balance]) and share the model's layers,
// which move to their devices.
// pipeline: the same stages, --chunks micro-batches under --pipeline-schedule, with
// --pipeline-checkpoint's micro-batches recomputed in their backward.
std::shared_ptr<nn::Module> apply_model_parallel(nn::Module& model, const TrainConfig& config, Device device,
                                                 nn::CrossEntropyLoss& criterion) {
  auto* resnet = dynamic_cast<nn::ResNet*>(&model);
  LOOM_CHECK(resnet != nullptr, "--mode mp needs a ResNet (its layers as a Sequential), got ", model.type_name());
  const int64_t count = config.mp_devices;
  const std::vector<Device> devices = consecutive_devices(device, count);
  auto layers = resnet->sequential();
  const int64_t model_chunks = count * config.virtual_stages;  // interleaved_1f1b: V per stage
  LOOM_CHECK(count >= 1 && model_chunks <= static_cast<int64_t>(layers->size()), "--mp-devices ", count,
             " x --virtual-stages ", config.virtual_stages, ": the model has ", layers->size(), " layers to cut into "
             "chunks (one or more each), so use at most ", layers->size(), " chunks");
  // Measured (--balance time) as the stages will run: on each stage's share of the threads.
  const int threads = omp_get_max_threads();
  if (config.mode == "pipeline") omp_set_num_threads(std::max(1, threads / static_cast<int>(count)));
  const std::vector<int64_t> balance = parallel::choose_balance(*layers, config.balance, config.balance_by,
                                                                model_chunks, balance_sample(*resnet, config, device));
  omp_set_num_threads(threads);
  print_balance(balance, config);
  std::shared_ptr<parallel::ModelParallel> mp;
  if (config.mode == "pipeline")
    mp = std::make_shared<parallel::pipeline::Pipeline>(
        layers, devices, balance, config.chunks, config.pipeline_schedule,
        [&criterion](const Tensor& out, const Tensor& target) { return criterion(out, target); },
        config.pipeline_checkpoint);
  else
    mp = std::make_shared<parallel::ModelParallel>(layers, devices, balance);
  if (config.progress) std::fprintf(stderr, "%s: %s\n", config.mode.c_str(), mp->extra_repr().c_str());
  return mp;
}

std::shared_ptr<parallel::pipeline::PipelineStage> apply_pipeline(nn::Module& model,
                                                                  std::shared_ptr<distributed::Communicator> pp_group,
                                                                  const TrainConfig& config, Device device,
                                                                  nn::CrossEntropyLoss& criterion) {
  auto* resnet = dynamic_cast<nn::ResNet*>(&model);
  LOOM_CHECK(resnet != nullptr, "--pp needs a ResNet (its layers as a Sequential), got ", model.type_name());
  // The balance is agreed over the world: under pp x dp the replicas of a stage must cut
  // alike too (Note [One balance for every rank]).
  auto world = distributed::default_group();
  auto stage = parallel::pipeline::apply_pipeline_processes(
      resnet->sequential(), std::move(pp_group), device,
      {.balance = config.balance, .balance_by = config.balance_by, .chunks = config.chunks,
       .schedule = config.pipeline_schedule, .virtual_stages = config.virtual_stages},
      [&criterion](const Tensor& out, const Tensor& target) { return criterion(out, target); },
      balance_sample(*resnet, config, device), world);
  if (world->rank() == 0) {  // once per run, not once per pipeline
    print_balance(stage->balance(), config);
    if (config.progress) std::fprintf(stderr, "pipeline of processes: %s\n", stage->extra_repr().c_str());
  }
  return stage;
}

std::shared_ptr<nn::Module> apply_ddp(std::shared_ptr<nn::Module> model,
                                      std::shared_ptr<distributed::Communicator> dp_group, const TrainConfig& config) {
  if (config.sync_bn) nn::convert_sync_batchnorm(model, dp_group);
  ddp::DDPOptions options;
  options.bucket_cap_mb = config.bucket_cap_mb;
  // .grad() is a view into the reduced bucket: finalize then has nothing to copy back, a
  // 43 MiB copy saved at the end of every ResNet18 backward, where nothing overlaps it,
  // and between steps the gradients take no memory of their own. (During backward each
  // fresh gradient still lives on its own until the hook copies it into its slot, as in
  // PyTorch: zero_grad() drops them.) The loop only reads gradients, which is all this
  // option asks of it.
  options.gradient_as_bucket_view = true;
  return std::make_shared<ddp::DistributedDataParallel>(model, std::move(dp_group), options);
}

void apply_ddp_to_stage(parallel::pipeline::PipelineStage& stage,
                        std::shared_ptr<distributed::Communicator> dp_group, const TrainConfig& config) {
  ddp::DDPOptions options;
  options.bucket_cap_mb = config.bucket_cap_mb;
  options.gradient_as_bucket_view = true;  // as apply_ddp: see there
  parallel::pipeline::replicate_stage(stage, std::move(dp_group), options);
}

// As torchtitan's apply_fsdp: every block is a unit (the default ModuleWrapPolicy), and
// the last block stays gathered from its forward to its backward, beside the head
// (Note [Which units stay gathered], parallel/fsdp/runtime.cpp).
static fsdp::FSDPOptions fsdp_options(fsdp::ShardingStrategy strategy) {
  return fsdp::FSDPOptions{.sharding_strategy = strategy, .keep_last_gathered = 2};
}

std::shared_ptr<nn::Module> apply_fsdp(std::shared_ptr<nn::Module> model, const distributed::DeviceMesh& mesh,
                                       const TrainConfig& config) {
  const fsdp::ShardingStrategy strategy = fsdp::parse_sharding_strategy(config.sharding_strategy);
  auto has = [&mesh](const std::string& dim) {
    const auto& names = mesh.dim_names();
    return std::find(names.begin(), names.end(), dim) != names.end();
  };
  // A degree of 1 is no mesh dimension (ParallelDims::build_mesh): one process has only
  // the one-rank "dp_replicate" dimension, and hybrid_shard with one replica (or shards
  // of one rank) is FULL_SHARD (or NO_SHARD) over the one dimension there is.
  if (strategy == fsdp::ShardingStrategy::HYBRID_SHARD && has("dp_shard") && has("dp_replicate")) {
    LOOM_CHECK(!config.sync_bn, "--sync-bn with --sharding-strategy hybrid_shard: SyncBatchNorm needs one group over "
               "every data-parallel rank, which this mesh does not have; use full_shard");
    return std::make_shared<fsdp::FullyShardedDataParallel>(
        model, std::pair{mesh.group("dp_shard"), mesh.group("dp_replicate")},
        fsdp_options(strategy));
  }
  auto group = mesh.group(has("dp_shard") ? "dp_shard" : "dp_replicate");
  if (config.sync_bn) nn::convert_sync_batchnorm(model, group);
  fsdp::ShardingStrategy one_dim = strategy;
  if (strategy == fsdp::ShardingStrategy::HYBRID_SHARD)
    one_dim = has("dp_shard") ? fsdp::ShardingStrategy::FULL_SHARD : fsdp::ShardingStrategy::NO_SHARD;
  return std::make_shared<fsdp::FullyShardedDataParallel>(model, group, fsdp_options(one_dim));
}

std::shared_ptr<nn::Module> parallelize(std::shared_ptr<nn::Module> model, const distributed::DeviceMesh* mesh,
                                        const TrainConfig& config, Device device, nn::CrossEntropyLoss& criterion) {
  // Inside one process, over several devices.
  if (config.mode == "dp") return apply_data_parallel(model, config, device);
  if (config.pp > 1) {
    LOOM_CHECK(mesh != nullptr, "--pp ", config.pp, " runs one stage per process: start it with loomrun");
    auto stage = apply_pipeline(*model, mesh->group("pp"), config, device, criterion);
    const auto& dims = mesh->dim_names();
    if (config.mode == "ddp" && std::count(dims.begin(), dims.end(), "dp_replicate"))
      apply_ddp_to_stage(*stage, mesh->group("dp_replicate"), config);  // 2-D: pp x dp
    return stage;
  }
  if (config.mode == "mp" || config.mode == "pipeline") return apply_model_parallel(*model, config, device, criterion);
  if (mesh == nullptr) return model;  // one process, one device
  // Across processes: shards of the model, or replicas of it, over the data-parallel dimensions.
  if (config.mode == "fsdp") return apply_fsdp(model, *mesh, config);
  return apply_ddp(model, mesh->group("dp_replicate"), config);
}

}  // namespace loom::examples
