#include "examples/train/trainer.h"

#include <omp.h>  // defines: omp_set_num_threads, for --threads

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "autograd/grad_mode.h"             // defines: NoGradGuard, for evaluation
#include "autograd/ops.h"                   // defines: argmax, eq, sum
#include "core/allocator.h"                 // defines: memory_stats (the run's peak memory)
#include "core/atomic_file.h"               // defines: write_file_atomically (--metrics-json)
#include "core/cpu/bf16_path.h"              // defines: bf16_path_description (--amp bf16 on the CPU)
#include "core/trace.h"                     // defines: trace::Span (LOOM_TRACE=path draws the steps)
#include "data/cifar10.h"                   // defines: CIFAR10
#include "data/data_root.h"                 // defines: find_cifar10_root
#include "data/dataloader.h"                // defines: DataLoader
#include "data/synthetic_cifar.h"           // defines: SyntheticCIFAR
#include "data/transforms.h"                // defines: Compose, RandomCrop, ...
#include "examples/train/checkpoint.h"      // defines: save_checkpoint, load_checkpoint
#include "examples/train/device.h"          // defines: training_device, to_training_device, read_loss_and_correct
#include "examples/train/distributed.h"     // defines: Distributed, what --mode ddp changes
#include "examples/train/mixed_precision.h" // defines: MixedPrecision, what --amp changes
#include "examples/train/optimizer.h"       // defines: build_optimizer, gather_optimizer_state (--zero-redundancy-optimizer)
#include "examples/train/parallelize.h"     // defines: parallelize, one apply_* per parallelism
#include "examples/train/progress.h"        // defines: ProgressBar, RunningMetrics, RunPlan
#include "examples/train/sharded_checkpoint.h"  // defines: save_sharded_checkpoint, what --checkpoint-format sharded changes
#include "nn/loss.h"                        // defines: CrossEntropyLoss
#include "nn/model_state.h"                 // defines: model_state_bytes (parameters + gradients + optimizer state)
#include "nn/optim/lr_scheduler.h"          // defines: CosineAnnealingLR, OneCycleLR
#include "nn/optim/sgd.h"                   // defines: SGD
#include "nn/resnet.h"                      // defines: resnet18, resnet_tiny
#include "nn/safetensors.h"                 // defines: nn::save, nn::load
#include "parallel/comm/launch_env.h"       // defines: launch_local_rank (loomrun's, Slurm's or Open MPI's)
#include "parallel/fsdp/state_dict.h"       // defines: save_full_state_dict, what --save does under --mode fsdp
#include "parallel/pipeline/pipeline.h"     // defines: Pipeline, what --mode pipeline changes
#include "parallel/pipeline/pipeline_stage.h"  // defines: PipelineStage, what --pp changes

namespace loom::examples {
namespace {

namespace T = data::transforms;
using Clock = std::chrono::steady_clock;

// The seed's normalisation constants (train_ddp.py), for training and test alike.
const std::vector<double> kMean = {0.4914, 0.4822, 0.4465};
const std::vector<double> kStd = {0.2023, 0.1994, 0.2010};

std::shared_ptr<data::Dataset> make_dataset(const TrainConfig& config, bool train) {
  T::TransformPtr transform =
      train && config.augment
          ? std::make_shared<T::Compose>(T::RandomCrop(32, 4), T::RandomHorizontalFlip(), T::ToTensor(),
                                         T::Normalize(kMean, kStd))
          : std::make_shared<T::Compose>(T::ToTensor(), T::Normalize(kMean, kStd));
  if (config.synthetic) {
    return std::make_shared<data::SyntheticCIFAR>(train ? config.synthetic_size : 10000, config.seed + (train ? 0 : 1),
                                                  transform);
  }
  return std::make_shared<data::CIFAR10>(data::find_cifar10_root(config.data), train, transform);
}

std::shared_ptr<nn::Module> make_model(const TrainConfig& config) {
  if (config.model == "resnet18") return nn::resnet18(10);
  if (config.model == "tiny") return nn::resnet_tiny(10);
  LOOM_FAIL("--model: expected resnet18 or tiny, got '", config.model, "'");
}

std::unique_ptr<optim::LRScheduler> make_scheduler(const TrainConfig& config, optim::Optimizer& optimizer,
                                                   int64_t total_steps) {
  if (config.schedule == "none") return nullptr;
  if (config.schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(optimizer, total_steps);
  if (config.schedule == "onecycle") return std::make_unique<optim::OneCycleLR>(optimizer, config.lr, total_steps);
  LOOM_FAIL("--schedule: expected none, cosine or onecycle, got '", config.schedule, "'");
}

// Counts only the first `real` examples, running every batch (ddp: the rest is padding,
// Note [Evaluating a shard without double counting]).
RunningMetrics evaluate(nn::Module& model, nn::CrossEntropyLoss& criterion, data::DataLoader& loader, Device device,
                        MemoryFormat format, int64_t real) {
  trace::Span span("evaluate", "train");
  NoGradGuard no_grad;
  model.eval();
  RunningMetrics metrics;
  for (data::Batch& batch : loader) {
    Tensor images = to_training_device(batch.data, device, format), labels = to_training_device(batch.target, device);
    Tensor logits = model(images);
    labels = labels.to(logits.device());  // --mode mp: the logits are on the last stage's device
    int64_t n = batch.size();
    if (metrics.examples + static_cast<double>(n) > static_cast<double>(real)) {
      n = std::max<int64_t>(real - static_cast<int64_t>(metrics.examples), 0);  // the rest is padding
      if (n == 0) continue;
      logits = logits.narrow(0, 0, n);
      labels = labels.narrow(0, 0, n);
    }
    const auto [loss, correct] = read_loss_and_correct(criterion(logits, labels), logits, labels);
    metrics.add(loss, correct, n);
  }
  model.train();
  return metrics;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// Counts out of range and pipeline settings are refused here, naming the flag, before
// anything is built: the code that uses them would divide by --chunks 0, read
// --max-steps -7 as "no limit", finish --epochs 0 successfully having done nothing, and
// learn of a misspelt --pipeline-checkpoint only after loading the data and timing the
// model's layers.
void check_flags(const TrainConfig& c) {
  auto expect = [](bool ok, const char* flag, int64_t got, const char* expected) {
    LOOM_CHECK(ok, flag, ": expected ", expected, ", got ", got);
  };
  expect(c.epochs >= 1 || c.eval_only, "--epochs", c.epochs, "at least 1 (--eval-only evaluates without training)");
  expect(c.max_steps >= -1, "--max-steps", c.max_steps, "-1 (no limit) or 0 or more (0: --save the initial weights)");
  expect(c.batch_size >= 1, "--batch-size", c.batch_size, "at least 1");
  expect(c.workers >= 0, "--workers", c.workers, "0 (load in the training thread) or more");
  expect(c.threads >= 0, "--threads", c.threads, "0 (OpenMP's default) or more");
  expect(c.checkpoint_every >= 0, "--checkpoint-every", c.checkpoint_every, "0 (only at epoch ends) or more");
  expect(c.eval_limit >= -1, "--eval-limit", c.eval_limit, "-1 (the whole test set) or 0 or more");
  expect(c.synthetic_size >= 1, "TrainConfig::synthetic_size", c.synthetic_size, "at least 1");
  expect(c.dp_devices >= 0, "--dp-devices", c.dp_devices, "0 (the default devices) or more");
  expect(c.chunks >= 1, "--chunks", c.chunks, "at least 1 micro-batch per batch");
  LOOM_CHECK(c.pipeline_schedule == "gpipe" || c.pipeline_schedule == "1f1b" || c.pipeline_schedule == "interleaved_1f1b",
             "--pipeline-schedule: expected gpipe, 1f1b or interleaved_1f1b, got '", c.pipeline_schedule, "'");
  expect(c.virtual_stages >= 1, "--virtual-stages", c.virtual_stages, "at least 1 model chunk per stage");
  LOOM_CHECK(c.virtual_stages == 1 || c.pipeline_schedule == "interleaved_1f1b", "--virtual-stages ",
             c.virtual_stages, " needs --pipeline-schedule interleaved_1f1b, got ", c.pipeline_schedule);
  expect(c.pp >= 1, "--pp", c.pp, "at least 1 pipeline stage");
  LOOM_CHECK(c.pp == 1 || c.mode == "pipeline" || c.mode == "ddp", "--pp ", c.pp, " runs the stages of a pipeline "
             "as processes: --mode pipeline (one pipeline) or --mode ddp (pipelines side by side, each stage's "
             "replicas data-parallel); got --mode ", c.mode);
  LOOM_CHECK(c.pp == 1 || !c.sync_bn, "--sync-bn with --pp ", c.pp, ": SyncBatchNorm inside pipeline stages is not "
             "supported; drop --sync-bn");
  LOOM_CHECK(c.pp == 1 || !c.zero_redundancy_optimizer, "--zero-redundancy-optimizer with --pp ", c.pp, ": each "
             "stage's optimizer is not sharded over its replicas yet; drop one of the two");
  LOOM_CHECK(c.pp == 1 || c.pipeline_checkpoint == "never", "--pipeline-checkpoint ", c.pipeline_checkpoint,
             " is for the stages of one process; --pp ", c.pp, " runs them as processes (use never)");
  LOOM_CHECK(c.pp == 1 || c.checkpoint_dir.empty(), "--checkpoint-dir with --pp ", c.pp, ": each process holds only "
             "its stage's optimizer state, which the checkpoint format does not gather yet; use --save");
  if (!c.checkpoint_format.empty()) (void)sharded_checkpoint_format(c);  // full | sharded, and only where sharded
  LOOM_CHECK((c.balance.empty() && c.balance_by == "cost") || c.mode == "pipeline" || c.mode == "mp" || c.pp > 1,
             "--balance cuts the model into stages: it needs --mode mp or pipeline, or --pp, got --mode ", c.mode);
  LOOM_CHECK(c.pipeline_checkpoint == "never" || c.pipeline_checkpoint == "except_last" ||
                 c.pipeline_checkpoint == "always",
             "--pipeline-checkpoint: expected never, except_last or always, got '", c.pipeline_checkpoint, "'");
  LOOM_CHECK(!c.zero_redundancy_optimizer || c.mode == "ddp", "--zero-redundancy-optimizer shards the optimizer "
             "state over DDP's ranks: it needs --mode ddp, got --mode ", c.mode);
  LOOM_CHECK(c.pipeline_checkpoint == "never" || c.mode == "pipeline", "--pipeline-checkpoint ",
             c.pipeline_checkpoint, " recomputes a pipeline's micro-batches: it needs --mode pipeline, got --mode ",
             c.mode);
}

}  // namespace

TrainResult train_cifar10(const TrainConfig& config) {
  check_flags(config);
  if (config.threads > 0) omp_set_num_threads(static_cast<int>(config.threads));
  // First: a missing GPU is an error naming why, before any data is read. Across
  // processes (ddp, --pp), "--device cuda" is this process's GPU, cuda:LOCAL_RANK (set by
  // loomrun; srun and mpirun say it as SLURM_LOCALID and OMPI_COMM_WORLD_LOCAL_RANK).
  const Device device = training_device(
      config.device, ParallelDims::needs_process_group(config) ? distributed::launch_local_rank() : 0);
  Distributed dist(config);  // single mode: rank 0 of 1, no communication
  trace::set_thread_name("train");  // this thread's row in a LOOM_TRACE picture
  manual_seed(config.seed);

  auto train_set = make_dataset(config, /*train=*/true);
  auto test_set = make_dataset(config, /*train=*/false);
  // ddp: each rank its shard (a DistributedSampler, shuffled per epoch) instead of shuffle.
  auto train_sampler = dist.train_sampler(train_set->size(), config);
  data::DataLoader train_loader(train_set, {.batch_size = config.batch_size,
                                            .shuffle = train_sampler ? false : config.shuffle,
                                            .sampler = train_sampler, .num_workers = config.workers,
                                            .persistent_workers = config.workers > 0, .seed = config.seed});
  // Each rank (the one process, outside ddp) its in-order share of the first eval_count
  // test images, padding excluded (Note [Evaluating a shard without double counting]):
  // --eval-limit is exact, not rounded up to whole batches.
  const int64_t eval_count = config.eval_limit >= 0 ? std::min(config.eval_limit, test_set->size()) : test_set->size();
  data::DataLoader test_loader(test_set, {.batch_size = 256, .sampler = dist.eval_sampler(eval_count),
                                          .num_workers = config.workers, .persistent_workers = config.workers > 0});
  const int64_t eval_real = dist.real_examples(eval_count);

  auto model = make_model(config);
  model->to(device);
  if (!config.init.empty()) nn::load(*model, config.init);
  // The module the loop calls: the model, or DataParallel / DistributedDataParallel
  // around it (which share its parameters, so the optimizer and checkpoints use the
  // model's own).
  nn::CrossEntropyLoss criterion(Tensor(), Reduction::Mean, -100, config.label_smoothing);
  auto net = parallelize(model, dist.mesh(), config, device, criterion);
  // --mode pipeline: forward and backward are one call, the schedule's (Note [Stages wait
  // only for what they need]).
  auto* pipeline = dynamic_cast<parallel::pipeline::Pipeline*>(net.get());
  // --pp: this process's stage; the whole model is on every rank only after share_weights.
  auto* stage = dynamic_cast<parallel::pipeline::PipelineStage*>(net.get());
  const MemoryFormat input_format = input_memory_format(config.memory_format, config.amp, device);
  auto evaluate_model = [&] {
    if (!stage) return evaluate(*net, criterion, test_loader, device, input_format, eval_real);
    stage->share_weights();  // every rank evaluates the whole model on its shard, stage 0 counts
    RunningMetrics m = evaluate(*model, criterion, test_loader, device, input_format, eval_real);
    return dist.counts_examples() ? m : RunningMetrics{};
  };
  LOOM_CHECK(config.lr_scaling == "none" || config.lr_scaling == "linear", "--lr-scaling: expected none or linear, "
             "got '", config.lr_scaling, "'");
  // Linear scaling follows the global batch: data-parallel replicas multiply it, the
  // stages of a pipeline (--pp) do not.
  const double lr = config.lr_scaling == "linear" ? config.lr * dist.dims().dp_size() : config.lr;
  // SGD, or SGD inside ZeroRedundancyOptimizer (--zero-redundancy-optimizer).
  std::unique_ptr<optim::Optimizer> built_optimizer = build_optimizer(net->parameters(), dist.mesh(), config, lr);
  optim::Optimizer& optimizer = *built_optimizer;
  const int64_t steps_per_epoch = train_loader.size();
  // The schedule spans --epochs; --max-steps only stops early, so that a run cut short
  // (and later resumed) follows the same learning-rate curve as an uninterrupted one.
  TrainConfig scheduled = config;
  scheduled.lr = lr;  // --lr-scaling linear: the schedule peaks at the scaled rate
  auto scheduler = make_scheduler(scheduled, optimizer, std::max<int64_t>(steps_per_epoch * config.epochs, 1));
  MixedPrecision amp(config.amp, device);
  if (config.amp == "bf16" && device.type == DeviceType::CPU && dist.is_main())
    std::printf("--amp bf16 on the CPU: %s; %s activations (--memory-format)\n", cpu::bf16_path_description(),
                input_format == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW");
  // fsdp: the model's parameters and the optimizer's state are sharded; ZeRO-1: the
  // optimizer's state. By default each rank then writes its own shard (Note [Sharded
  // checkpoints in train_cifar10]); --checkpoint-format full holds them whole, as every
  // other mode writes them: every rank gathers, rank 0 writes, and on resuming each rank
  // keeps its shard (parallel/fsdp/state_dict.h).
  auto* sharded = dynamic_cast<fsdp::FullyShardedDataParallel*>(net.get());
  const bool sharded_format = !config.checkpoint_dir.empty() && sharded_checkpoint_format(config);
  auto save = [&](const TrainingPosition& at) {  // a collective under fsdp, ZeRO and sharded
    if (sharded_format) {
      save_sharded_checkpoint(config.checkpoint_dir, dist, sharded, *model, optimizer, scheduler.get(), at,
                              &amp.scaler());
    } else if (sharded) {
      OrderedDict<Tensor> model_state = fsdp::full_state_dict(*sharded);
      OrderedDict<Tensor> optimizer_state = fsdp::full_optim_state_dict(*sharded, optimizer);
      if (dist.is_main())
        save_checkpoint(config.checkpoint_dir, model_state, optimizer_state, scheduler.get(), at, &amp.scaler());
    } else {
      gather_optimizer_state(optimizer);  // ZeRO-1: the whole state to rank 0 (a collective)
      if (dist.is_main()) save_checkpoint(config.checkpoint_dir, *model, optimizer, scheduler.get(), at, &amp.scaler());
    }
  };

  TrainingPosition position;
  // --resume, or a restart by loomrun --max-restarts: Note [Resuming after a restart].
  LOOM_CHECK(!config.resume || !config.checkpoint_dir.empty(), "--resume needs --checkpoint-dir DIR");
  // Skipped checkpoints and where a run resumed are said even under --quiet: a run that
  // silently continued from an older step than expected would be hard to explain.
  const std::string resume_from = checkpoint_to_resume(config.checkpoint_dir, config.resume, sharded_format, dist.is_main());
  const bool resume = !resume_from.empty();
  LOOM_CHECK(dist.sum(resume ? 1.0 : 0.0) == (resume ? dist.world_size() : 0), "--checkpoint-dir ",
             config.checkpoint_dir, ": some ranks found a checkpoint to resume from and others did not; on several "
             "nodes the directory must be shared by every rank");
  if (sharded_format && !resume && dist.is_main()) {
    const int removed = clear_sharded_checkpoints(config.checkpoint_dir);
    if (removed > 0 && config.progress)
      std::fprintf(stderr, "%s: removed %d sharded checkpoint(s) of an earlier run (a first start trains from "
                   "scratch; --resume continues one)\n", config.checkpoint_dir.c_str(), removed);
  }
  if (resume) {
    if (sharded_format) {
      position = load_sharded_checkpoint(resume_from, dist, sharded, *model, optimizer, scheduler.get(), &amp.scaler());
      // Every rank must have picked the same step (a shard written meanwhile could differ).
      LOOM_CHECK(dist.sum(static_cast<double>(position.global_step)) == dist.world_size() * position.global_step,
                 "--checkpoint-dir ", config.checkpoint_dir, ": the ranks resumed from different sharded checkpoints; "
                 "on several nodes the directory must be shared by every rank");
    } else if (sharded) {
      CheckpointState state = read_checkpoint(config.checkpoint_dir, scheduler.get(), &amp.scaler());
      fsdp::load_full_state_dict(*sharded, state.model);
      fsdp::load_full_optim_state_dict(*sharded, optimizer, state.optimizer);
      position = state.position;
    } else {
      position = load_checkpoint(config.checkpoint_dir, *model, optimizer, scheduler.get(), &amp.scaler());
    }
    // A checkpoint's epoch metrics are every rank's sum; one rank carries them on.
    if (!dist.is_main()) position.metrics = RunningMetrics{};
    if (dist.is_main())
      std::fprintf(stderr, "resumed from %s at epoch %lld, step %lld\n", resume_from.c_str(),
                   static_cast<long long>(position.epoch + 1), static_cast<long long>(position.global_step));
  }

  TrainResult result;
  if (config.eval_only) {
    RunningMetrics test = dist.sum(evaluate_model());
    result.test_loss = test.loss();
    result.test_acc = test.accuracy();
    result.test_images = static_cast<int64_t>(test.examples);
    if (dist.is_main())
      std::printf("eval: test loss %.4f  test acc %.2f%% (%lld images)\n", test.loss(), 100 * test.accuracy(),
                  static_cast<long long>(test.examples));
    if (dist.is_main() && !config.metrics_json.empty()) write_metrics_json(result, config.metrics_json);
    dist.barrier();  // as after training: nobody leaves before rank 0 has written the file
    return result;
  }

  net->train();
  double timed_images = 0, timed_seconds = 0;
  std::vector<double> step_seconds;
  bool out_of_steps = false;
  for (int64_t epoch = position.epoch; epoch < config.epochs && !out_of_steps; ++epoch) {
    train_loader.set_epoch(epoch);  // the order and augmentation of an epoch depend on (seed, epoch) only
    RunningMetrics metrics = epoch == position.epoch ? position.metrics : RunningMetrics{};
    const int64_t skip = epoch == position.epoch ? position.step_in_epoch : 0;
    ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(config.epochs), steps_per_epoch,
                    config.progress && dist.is_main());
    auto epoch_start = Clock::now();
    double epoch_images = 0;
    int64_t step_in_epoch = 0;
    for (data::Batch& batch : train_loader) {
      if (step_in_epoch < skip) {  // resuming mid-epoch: these batches were trained on already
        ++step_in_epoch;
        continue;
      }
      if (config.max_steps >= 0 && position.global_step >= config.max_steps) {
        out_of_steps = true;
        break;
      }
      auto step_start = Clock::now();
      trace::Span step_span("step " + std::to_string(position.global_step + 1), "train");
      // On a GPU: queued copies from pinned memory; the host runs ahead to the forward.
      Tensor images = to_training_device(batch.data, device, input_format);
      Tensor labels = to_training_device(batch.target, device);
      Tensor logits, loss;
      int64_t stage_correct = -1;  // --pp: the step's all-reduced accuracy
      if (stage) {
        trace::Span span("pipeline forward and backward", "train");
        optimizer.zero_grad();
        auto autocast_scope = amp.autocast();
        auto result = stage->step(images, labels, amp.loss_scale());  // this rank's stage; loss on every rank
        loss = result.loss;
        stage_correct = result.correct;
      } else if (pipeline) {
        trace::Span span("pipeline forward and backward", "train");
        optimizer.zero_grad();
        auto autocast_scope = amp.autocast();  // the stages inherit it; backward runs without
        auto result = pipeline->step(images, labels, amp.loss_scale());  // every micro-batch, on every stage
        logits = result.output;
        loss = result.loss;
        labels = labels.to(logits.device());
      } else {
        {
          trace::Span span("forward", "train");
          auto autocast_scope = amp.autocast();  // --amp bf16|fp16: 16-bit convs and matmuls
          logits = (*net)(images);
          labels = labels.to(logits.device());  // --mode mp: the logits are on the last stage's device
          loss = criterion(logits, labels);
        }
        optimizer.zero_grad();
        trace::Span span("backward", "train");  // ddp: returns with averaged gradients
        amp.backward(loss);  // loss.backward(), scaled under --amp fp16
      }
      {
        trace::Span span("optimizer step", "train");
        amp.step(optimizer);  // optimizer.step(); --amp fp16 skips inf/NaN steps
      }
      if (scheduler) scheduler->step();
      // The step's one wait for the GPU: loss and accuracy come back in a single copy.
      const auto [step_loss, step_correct] =
          stage ? std::pair<float, int64_t>{static_cast<float>(loss.item<double>()), stage_correct}
                : read_loss_and_correct(loss, logits, labels);
      if (dist.counts_examples()) metrics.add(step_loss, step_correct, batch.size());
      ++step_in_epoch;
      ++position.global_step;

      double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
      const double counted = dist.counts_examples() ? static_cast<double>(batch.size()) : 0;
      epoch_images += counted;
      if (position.global_step > 1) {  // the first step warms caches and the allocator
        timed_images += counted;
        timed_seconds += seconds;
        step_seconds.push_back(seconds);
      }
      // After the step, outside its timing: gradients still held, the optimizer's state grown.
      // The module the loop calls: FSDP's shards, a --pp stage's own chunks (the model's own
      // parameters are FSDP's freed views, or other stages' untrained copies).
      result.model_state_bytes = nn::model_state_bytes(*net, optimizer);
      double elapsed = std::chrono::duration<double>(Clock::now() - epoch_start).count();
      bar.update(step_in_epoch, metrics, dist.dims().dp_size() * epoch_images / std::max(elapsed, 1e-9));
      bar.say_expected_duration({config.epochs, steps_per_epoch, config.max_steps, config.batch_size, eval_real},
                                step_seconds);  // once, after the first few timed steps
      if (!config.checkpoint_dir.empty() && config.checkpoint_every > 0 &&
          position.global_step % config.checkpoint_every == 0) {
        RunningMetrics so_far = dist.sum(metrics);  // every rank's examples (a collective)
        save({epoch, step_in_epoch, position.global_step, so_far});
        dist.barrier();
      }
    }
    bar.finish();
    double epoch_seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    RunningMetrics test = dist.sum(evaluate_model());
    metrics = dist.sum(metrics);
    epoch_images = dist.sum(epoch_images);
    result.train_loss = metrics.loss();
    result.train_acc = metrics.accuracy();
    result.test_loss = test.loss();
    result.test_acc = test.accuracy();
    result.test_images = static_cast<int64_t>(test.examples);
    if (!out_of_steps || step_in_epoch == steps_per_epoch) result.epochs = epoch + 1;
    if (dist.is_main()) {
      std::printf("epoch %lld/%lld  %s  %s  time %.1fs  %.1f img/s\n", static_cast<long long>(epoch + 1),
                  static_cast<long long>(config.epochs), metrics.str("train").c_str(), test.str("test").c_str(),
                  epoch_seconds, epoch_images / std::max(epoch_seconds, 1e-9));
      std::fflush(stdout);
    }
    if (!config.checkpoint_dir.empty()) {
      bool finished_epoch = step_in_epoch == steps_per_epoch;
      save(finished_epoch ? TrainingPosition{epoch + 1, 0, position.global_step, {}}
                          : TrainingPosition{epoch, step_in_epoch, position.global_step, metrics});
      dist.barrier();
    }
  }
  result.steps = position.global_step;
  result.img_per_s = dist.sum(timed_seconds > 0 ? timed_images / timed_seconds : 0);
  result.median_step_s = median(step_seconds);
  result.peak_memory_bytes = memory_stats(device).peak_allocated_bytes;  // --device's (all CPU devices share one)
  {
    // Every rank's figures, printed by rank 0 (collectives): under ZeRO and FSDP they differ.
    auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
    const std::vector<double> peaks = dist.all_gather(mib(result.peak_memory_bytes));
    const std::vector<double> states = dist.all_gather(mib(result.model_state_bytes));
    if (dist.is_main()) {
      std::string line = "memory per rank (MiB):";
      for (size_t r = 0; r < peaks.size(); ++r) {
        char part[96];
        std::snprintf(part, sizeof(part), "%s rank %zu peak %.1f, model state %.1f", r ? ";" : "", r, peaks[r],
                      states[r]);
        line += part;
      }
      std::printf("%s\n", line.c_str());
    }
  }
  if (stage && !config.save.empty()) stage->share_weights();  // rank 0 saves the whole model
  // fsdp: the model's parameters are shards; every rank gathers, rank 0 writes the same file.
  if (!config.save.empty() && sharded) fsdp::save_full_state_dict(*sharded, config.save);
  if (dist.is_main()) {
    if (!config.save.empty()) {
      if (!sharded) nn::save(*model, config.save);  // the model's own keys, without DDP's "module." prefix
      std::printf("saved weights to %s\n", config.save.c_str());
    }
    if (!config.metrics_json.empty()) write_metrics_json(result, config.metrics_json);
  }
  dist.barrier();  // nobody leaves (or reads the files) before rank 0 has written them
  return result;
}

void write_metrics_json(const TrainResult& r, const std::string& path) {
  char json[512];
  std::snprintf(json, sizeof(json),
                "{\"train_loss\": %.6f, \"train_acc\": %.6f, \"test_loss\": %.6f, \"test_acc\": %.6f, "
                "\"test_images\": %lld, \"img_per_s\": %.3f, \"median_step_s\": %.6f, \"peak_memory_mib\": %.1f, "
                "\"model_state_mib\": %.1f, \"steps\": %lld, \"epochs\": %lld}\n",
                r.train_loss, r.train_acc, r.test_loss, r.test_acc, static_cast<long long>(r.test_images), r.img_per_s,
                r.median_step_s, static_cast<double>(r.peak_memory_bytes) / (1 << 20),
                static_cast<double>(r.model_state_bytes) / (1 << 20), static_cast<long long>(r.steps),
                static_cast<long long>(r.epochs));
  write_file_atomically(path, json, "--metrics-json");  // readers never see half a file
}

}  // namespace loom::examples
