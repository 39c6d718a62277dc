#include "train/trainer.h"

#include <omp.h>  // defines: omp_set_num_threads, for --threads

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>  // defines: std::function (the step's clipping)

#include "autograd/grad_mode.h"        // defines: NoGradGuard, for evaluation
#include "autograd/ops.h"              // defines: argmax, eq, sum
#include "core/allocator.h"            // defines: memory_stats (the run's peak memory)
#include "core/atomic_file.h"          // defines: write_file_atomically (--metrics-json)
#include "core/cpu/bf16_path.h"        // defines: bf16_path_description (--amp bf16 on the CPU)
#include "core/shape_only.h"           // defines: ShapeOnlyGuard (--estimate-memory)
#include "core/trace.h"                // defines: trace::Span (LOOM_TRACE=path draws the steps)
#include "data/dataloader.h"           // defines: DataLoader
#include "nn/loss.h"                   // defines: CrossEntropyLoss
#include "nn/model_state.h"            // defines: model_state_bytes (parameters + gradients + optimizer state)
#include "nn/optim/lookahead.h"        // defines: Lookahead (--lookahead-every)
#include "nn/optim/lr_scheduler.h"     // defines: CosineAnnealingLR, OneCycleLR
#include "nn/optim/sgd.h"              // defines: SGD
#include "nn/safetensors.h"            // defines: nn::load (--init)
#include "nn/test_time_augmentation.h"  // defines: tta_logits (--tta)
#include "parallel/comm/launch_env.h"  // defines: launch_local_rank (loomrun's, Slurm's or Open MPI's)
#include "train/checkpointer.h"        // defines: Checkpointer (save, resume, --save)
#include "train/command_line.h"        // defines: check_train_config (the flag table's rules)
#include "train/degrees.h"             // defines: needs_process_group
#include "train/device.h"              // defines: training_device, to_training_device, read_loss_and_correct
#include "train/distributed.h"         // defines: Distributed, what --mode ddp changes
#include "train/estimate_memory.h"     // defines: measure_shape_only_steps, report_memory_estimate (--estimate-memory)
#include "train/memory_advice.h"       // defines: throw_with_advice (Note [Advice after an out-of-memory error])
#include "train/loaders.h"             // defines: Loaders (each rank's data)
#include "train/grad_clipping.h"       // defines: GradClipper (--clip-grad-norm)
#include "train/mixed_precision.h"     // defines: MixedPrecision, what --amp changes
#include "train/model_spec.h"          // defines: model_spec (--model: resnet18 ... vit_small, tiny)
#include "train/optimizer.h"           // defines: build_optimizer (--zero-redundancy-optimizer)
#include "train/parallelize.h"         // defines: parallelize, one apply_* per parallelism
#include "train/progress.h"            // defines: ProgressBar, RunningMetrics, RunPlan

namespace loom::training {
namespace {

using Clock = std::chrono::steady_clock;

// --device for this process. Across processes, "--device cuda" is this process's GPU,
// cuda:LOCAL_RANK (set by loomrun; srun and mpirun say it as SLURM_LOCALID and
// OMPI_COMM_WORLD_LOCAL_RANK).
Device process_device(const TrainConfig& config) {
  return training_device(config.training.device, needs_process_group(config) ? distributed::launch_local_rank() : 0);
}

std::shared_ptr<nn::Module> make_model(const TrainConfig& config) {
  return model_spec(config.model.name)
      .build(config.model.name, 10);  // an unknown name: an error listing the known ones
}

// The schedule spans --epochs; --max-steps only stops early, so that a run cut short
// (and later resumed) follows the same learning-rate curve as an uninterrupted one. `lr`:
// --lr after --lr-scaling, where the schedule peaks.
std::unique_ptr<optim::LRScheduler> make_scheduler(const TrainConfig& config, double lr, optim::Optimizer& optimizer,
                                                   int64_t steps_per_epoch) {
  const int64_t total_steps = std::max<int64_t>(steps_per_epoch * config.training.epochs, 1);
  if (config.optim.schedule == "none") return nullptr;
  if (config.optim.schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(optimizer, total_steps);
  if (config.optim.schedule == "onecycle") return std::make_unique<optim::OneCycleLR>(optimizer, lr, total_steps);
  // warmup_cosine (the flag table admits nothing else), a transformer's: from lr / warmup
  // up to lr, then cosine to 0.
  {
    const auto warmup = static_cast<int64_t>(config.optim.warmup_epochs * static_cast<double>(steps_per_epoch));
    LOOM_CHECK(warmup >= 1 && warmup < total_steps, "--schedule warmup_cosine: --warmup-epochs ",
               config.optim.warmup_epochs, " gives ", warmup, " warm-up steps of the run's ", total_steps,
               "; it needs at least 1 and fewer than all");
    std::vector<std::shared_ptr<optim::LRScheduler>> parts = {
        std::make_shared<optim::LinearLR>(optimizer, 1.0 / static_cast<double>(warmup), 1.0, warmup),
        std::make_shared<optim::CosineAnnealingLR>(optimizer, total_steps - warmup)};
    return std::make_unique<optim::SequentialLR>(optimizer, std::move(parts), std::vector<int64_t>{warmup});
  }
}

// The timed steps: all but the first, which warms caches and the allocator.
struct StepTimes {
  std::vector<double> step_seconds;
  double images = 0, seconds = 0;
  void add(int64_t global_step, double counted_images, Clock::time_point start) {
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (global_step <= 1) return;
    images += counted_images;
    seconds += s;
    step_seconds.push_back(s);
  }
  double images_per_second() const { return seconds > 0 ? images / seconds : 0; }
};

struct EpochClock {
  Clock::time_point start = Clock::now();
  double images = 0;  // this rank's counted images
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  double images_per_second() const { return images / std::max(seconds(), 1e-9); }
};

void record_epoch(TrainResult& result, const RunningMetrics& train, const RunningMetrics& test) {
  result.train_loss = train.loss();
  result.train_acc = train.accuracy();
  result.test_loss = test.loss();
  result.test_acc = test.accuracy();
  result.test_images = static_cast<int64_t>(test.examples);
}

nn::TTA tta_level(const std::string& tta) {
  return tta == "mirror_translate" ? nn::TTA::mirror_translate : tta == "mirror" ? nn::TTA::mirror : nn::TTA::none;
}

// What the printed lines call the test metrics: "tta test" where --tta weighs several views.
const char* test_word(const TrainConfig& config) { return config.training.tta == "none" ? "test" : "tta test"; }

// Counts only the first `real` examples, running every batch (ddp: the rest is padding,
// Note [Evaluating a shard without double counting]). With --tta the loss and accuracy are
// those of the views' weighted logits (Note [TTA weights]).
RunningMetrics evaluate(nn::Module& model, nn::CrossEntropyLoss& criterion, data::DataLoader& loader, Device device,
                        MemoryFormat format, int64_t real, nn::TTA tta) {
  trace::Span span("evaluate", "train");
  NoGradGuard no_grad;
  model.eval();
  RunningMetrics metrics;
  for (data::Batch& batch : loader) {
    Tensor images = to_training_device(batch.data, device, format), labels = to_training_device(batch.target, device);
    Tensor logits = nn::tta_logits(model, images, tta);
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

// --eval-only: the test set's metrics (every rank's, summed), printed and written.
TrainResult evaluate_only(const RunningMetrics& test, const TrainConfig& config, const Distributed& dist) {
  TrainResult result;
  record_epoch(result, RunningMetrics{}, test);
  if (dist.is_main())
    std::printf("eval: %s (%lld images)\n", test.str(test_word(config)).c_str(),
                static_cast<long long>(test.examples));
  if (dist.is_main() && !config.metrics.json.empty()) write_metrics_json(result, config.metrics.json);
  dist.barrier();  // as after training: nobody leaves before rank 0 has written the file
  return result;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// What one step gives the loop: the loss, and the logits where this rank has them (not on
// a pipeline's earlier stages) with the labels on their device.
struct StepOutput {
  Tensor loss, logits, labels;
};

// One optimizer step on one batch: the loop every PyTorch user knows. Its one branch: under
// a pipeline the schedule runs forward and backward of every micro-batch in one call
// (Note [Stages wait only for what they need]), as torchtitan's train_step.
StepOutput train_step(ParallelModel& parallel, nn::CrossEntropyLoss& criterion, optim::Optimizer& optimizer,
                      MixedPrecision& amp, const Tensor& images, Tensor labels,
                      const std::function<void()>& before_step = {}) {
  StepOutput out;
  if (parallel::pipeline::PipelineSchedule* pipeline = parallel.pipeline()) {
    trace::Span span("pipeline forward and backward", "train");
    optimizer.zero_grad();
    auto autocast_scope = amp.autocast();  // the stages inherit it; backward runs without
    parallel::pipeline::StepResult r = pipeline->step(images, labels, amp.loss_scale());
    out = {r.loss, r.output, r.output.defined() ? labels.to(r.output.device()) : labels};
  } else {
    {
      trace::Span span("forward", "train");
      auto autocast_scope = amp.autocast();  // --amp bf16|fp16: 16-bit convs and matmuls
      out.logits = parallel.module()(images);
      out.labels = labels.to(out.logits.device());  // --mode mp: the logits are on the last stage's device
      out.loss = criterion(out.logits, out.labels);
    }
    optimizer.zero_grad();
    trace::Span span("backward", "train");  // ddp: returns with averaged gradients
    amp.backward(out.loss);  // loss.backward(), scaled under --amp fp16
  }
  if (before_step) before_step();  // --clip-grad-norm
  trace::Span span("optimizer step", "train");
  amp.step(optimizer);  // optimizer.step(); --amp fp16 skips inf/NaN steps
  return out;
}

// The step's one wait for the GPU: loss and accuracy come back in a single copy. Ranks
// without logits (a pipeline's earlier stages) count no examples (Distributed::counts_examples).
std::pair<float, int64_t> loss_and_correct(const StepOutput& s) {
  if (!s.logits.defined()) return {static_cast<float>(s.loss.item<double>()), 0};
  return read_loss_and_correct(s.loss, s.logits, s.labels);
}

// Every rank's peak memory and model state, printed by rank 0 (collectives): under ZeRO,
// FSDP and a pipeline they differ.
void print_memory_per_rank(const Distributed& dist, const TrainResult& result) {
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  const std::vector<double> peaks = dist.all_gather(mib(result.peak_memory_bytes));
  const std::vector<double> states = dist.all_gather(mib(result.model_state_bytes));
  if (!dist.is_main()) return;
  std::string line = "memory per rank (MiB):";
  for (size_t r = 0; r < peaks.size(); ++r) {
    char part[96];
    std::snprintf(part, sizeof(part), "%s rank %zu peak %.1f, model state %.1f", r ? ";" : "", r, peaks[r], states[r]);
    line += part;
  }
  std::printf("%s\n", line.c_str());
}

// A run of the loop, set up once (torchtitan's Trainer): the data, the model as
// parallelize() made it, the optimizer, the schedule and the one checkpointer. train_cifar10
// below drives it an epoch at a time.
class Trainer {
 public:
  // `world`: ranks as threads of this process (Distributed's), else the process group's.
  explicit Trainer(const TrainConfig& config, distributed::World* world = nullptr)
      : config_(config),
        // First: a missing GPU is an error naming why, before any data is read.
        device_(process_device(config)),
        dist_(config, world),  // the ParallelDims, the process group and its mesh; in one process rank 0 of 1
        data_(config, dist_),
        model_(make_model(config)),
        criterion_(Tensor(), Reduction::Mean, -100, config.optim.label_smoothing),
        parallel_(
            parallelize(loaded(model_, config, device_), dist_.dims(), dist_.mesh(), dist_.world(), config, device_,
                        criterion_)),
        input_format_(input_memory_format(config.training.memory_format, config.training.amp, device_)),
        // Linear scaling follows the global batch: data-parallel ranks multiply it,
        // pipeline stages do not.
        lr_(config.optim.lr_scaling == "linear" ? config.optim.lr * dist_.dims().batch_size() : config.optim.lr),
        // SGD over this rank's parameters, or inside ZeroRedundancyOptimizer (ZeRO-1).
        optimizer_(build_optimizer(parallel_.module().parameters(), parallel_.model(), parallel_.model_parameters_of(),
                                   dist_.mesh(), config, lr_)),
        scheduler_(make_scheduler(config, lr_, *optimizer_, data_.steps_per_epoch)),
        amp_(config.training.amp, device_, dist_.world()),
        lookahead_(make_lookahead(config, dist_.dims(), parallel_)),
        checkpointer_(config, dist_, parallel_, optimizer_, scheduler_.get(), &amp_.scaler(), lookahead_.get()) {
    // (Not for each of the memory advice's quiet estimates: the run said it already.)
    const bool say = config.metrics.progress || !config.training.estimate_memory;
    if (config.training.amp == "bf16" && device().type == DeviceType::CPU && dist_.is_main() && say)
      std::printf("--amp bf16 on the CPU: %s; %s activations (--memory-format)%s\n", cpu::bf16_path_description(),
                  input_format_ == MemoryFormat::ChannelsLast ? "channels-last" : "NCHW",
                  amp_.runs_float32_instead()
                      ? "; this CPU has no bfloat16 arithmetic, so autocast would only add casts: the step runs in "
                        "float32 (Note [bf16 autocast where the CPU has no bfloat16 arithmetic]; LOOM_CPU_BF16=staging "
                        "keeps bfloat16)"
                      : "");
    if (!config.recipe.empty() && dist_.is_main() && say)  // Note [Recipes are defaults] (train/recipe.h)
      std::printf("recipe %s, with the command line over it:\n%s\n", config.recipe.c_str(),
                  effective_config_toml(config).c_str());
    if (!config.checkpoint.dir.empty() && dist_.is_main() && !config.training.estimate_memory) {
      std::filesystem::create_directories(config.checkpoint.dir);  // the run's settings beside its checkpoints
      write_file_atomically(config.checkpoint.dir + "/config.toml", effective_config_toml(config),
                            "--checkpoint-dir");
    }
    if (config.training.tta != "none" && dist_.is_main() && say)
      std::printf("evaluation: test-time augmentation %s (%d views per image, Note [TTA weights])\n",
                  config.training.tta.c_str(), config.training.tta == "mirror" ? 2 : 6);
    if (config.optim.clip_grad_norm > 0) {  // over the whole model, however it is cut
      clipper_.emplace(parallel_, *optimizer_, config.optim.clip_grad_norm);
      clip_ = [this] { clipper_->clip(amp_); };
    }
    position_ = checkpointer_.resume();  // --resume, or a restart: Note [Resuming after a restart]
  }

  const TrainingPosition& position() const { return position_; }

  // Every rank its share of the test set; the summed metrics count each image once.
  RunningMetrics test() {
    RunningMetrics m = evaluate(parallel_.for_evaluation(), criterion_, data_.test, device(), input_format_,
                                data_.eval_real, tta_level(config_.training.tta));
    return dist_.sum(dist_.counts_examples() ? m : RunningMetrics{});
  }

  TrainResult evaluate_only() { return training::evaluate_only(test(), config_, dist_); }

  // --estimate-memory: the loop's own step on this rank's batches, shape-only, until the
  // allocator's steady state; then, with values back (the report's collectives carry
  // numbers), each device's peak. Note [How the memory estimate is made].
  TrainResult estimate_memory() {
    report_memory_estimate(measure_memory(), dist_, config_);
    return result_;
  }

  // Every rank of the run at this point (a collective; nothing in one process).
  void barrier() const { dist_.barrier(); }

  // The estimate of this rank's devices, without the report.
  std::vector<DeviceMemoryEstimate> measure_memory() {
    ShapeOnlyGuard shape_only;
    parallel_.module().train();
    auto batch = data_.train.begin();
    const auto step = [&] {
      if (batch == data_.train.end()) batch = data_.train.begin();  // an epoch shorter than the steps
      train_step(parallel_, criterion_, *optimizer_, amp_, to_training_device(batch->data, device(), input_format_),
                 to_training_device(batch->target, device()), clip_);
      ++batch;
    };
    const auto all_steady = [&](bool mine) { return dist_.max(mine ? 0 : 1) == 0; };
    return measure_shape_only_steps(training_devices(device(), dist_.dims()), step, all_steady, parallel_.module(),
                                    *optimizer_);
  }

  // One epoch (the rest of it, when resuming mid-epoch), its test and its checkpoint.
  // False once --max-steps stopped the run.
  bool train_epoch(int64_t epoch) {
    data_.train.set_epoch(epoch);  // the order and augmentation of an epoch depend on (seed, epoch) only
    RunningMetrics metrics = epoch == position_.epoch ? position_.metrics : RunningMetrics{};
    const int64_t skip = epoch == position_.epoch ? position_.step_in_epoch : 0;  // resuming mid-epoch
    ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(config_.training.epochs),
                    data_.steps_per_epoch, config_.metrics.progress && dist_.is_main());
    EpochClock clock;
    int64_t step_in_epoch = 0;
    bool out_of_steps = false;
    parallel_.module().train();
    for (data::Batch& batch : data_.train) {
      if (step_in_epoch < skip) {  // trained on already, before the restart
        ++step_in_epoch;
        continue;
      }
      if (config_.training.max_steps >= 0 && position_.global_step >= config_.training.max_steps) {
        out_of_steps = true;
        break;
      }
      const auto start = Clock::now();
      trace::Span step_span("step " + std::to_string(position_.global_step + 1), "train");
      const distributed::Traffic comm_before = distributed::process_traffic();
      // On a GPU: queued copies from pinned memory; the host runs ahead to the forward.
      const StepOutput step = train_step(parallel_, criterion_, *optimizer_, amp_,
                                         to_training_device(batch.data, device(), input_format_),
                                         to_training_device(batch.target, device()), clip_);
      result_.comm += distributed::process_traffic() - comm_before;  // the step's own collectives
      ++result_.comm_steps;
      if (scheduler_) scheduler_->step();
      step_lookahead(position_.global_step + 1);
      const auto [step_loss, step_correct] = loss_and_correct(step);
      const double counted = dist_.counts_examples() ? static_cast<double>(batch.size()) : 0;
      if (counted > 0) metrics.add(step_loss, step_correct, batch.size());
      ++step_in_epoch;
      ++position_.global_step;
      times_.add(position_.global_step, counted, start);
      clock.images += counted;
      // After the step, outside its timing: gradients still held, the optimizer's state grown.
      result_.model_state_bytes = nn::model_state_bytes(parallel_.module(), *optimizer_);
      bar.update(step_in_epoch, metrics, dist_.dims().batch_size() * clock.images_per_second());
      bar.say_expected_duration({config_.training.epochs, data_.steps_per_epoch, config_.training.max_steps,
                                 config_.data.batch_size, data_.eval_real},
                                times_.step_seconds);  // once, after the first few timed steps
      if (!config_.checkpoint.dir.empty() && config_.checkpoint.every > 0 &&
          position_.global_step % config_.checkpoint.every == 0)
        checkpointer_.save({epoch, step_in_epoch, position_.global_step, dist_.sum(metrics)});
    }
    bar.finish();
    const double seconds = clock.seconds();
    const RunningMetrics tested = test();
    metrics = dist_.sum(metrics);
    const double images = dist_.sum(clock.images);
    record_epoch(result_, metrics, tested);
    const bool finished = step_in_epoch == data_.steps_per_epoch;
    if (!out_of_steps || finished) result_.epochs = epoch + 1;
    if (dist_.is_main()) {
      // A run cut short by --max-steps says so: "epoch 1/3" alone reads as a third of the plan done.
      const std::string stopped =
          out_of_steps && !finished
              ? detail::str("  (stopped by --max-steps ", config_.training.max_steps, " after step ", step_in_epoch,
                            " of ", data_.steps_per_epoch, " in this epoch)")
              : std::string();
      std::printf("epoch %lld/%lld  %s  %s  time %.1fs  %.1f img/s%s\n", static_cast<long long>(epoch + 1),
                  static_cast<long long>(config_.training.epochs), metrics.str("train").c_str(),
                  tested.str(test_word(config_)).c_str(), seconds, images / std::max(seconds, 1e-9), stopped.c_str());
      std::fflush(stdout);
    }
    checkpointer_.save(finished ? TrainingPosition{epoch + 1, 0, position_.global_step, {}}
                                : TrainingPosition{epoch, step_in_epoch, position_.global_step, metrics});
    // A --max-steps that ends exactly at an epoch's end stops here, not after an empty next epoch.
    return !out_of_steps && !(config_.training.max_steps >= 0 && position_.global_step >= config_.training.max_steps);
  }

  // The run's figures, every rank's memory, --save and --metrics-json.
  TrainResult finish() {
    result_.steps = position_.global_step;
    result_.img_per_s = dist_.sum(times_.images_per_second());
    result_.median_step_s = median(times_.step_seconds);
    result_.peak_memory_bytes = memory_stats(device()).peak_allocated_bytes;  // --device's own
    print_memory_per_rank(dist_, result_);
    checkpointer_.save_weights(config_.checkpoint.save);
    if (dist_.is_main() && !config_.metrics.json.empty()) write_metrics_json(result_, config_.metrics.json);
    dist_.barrier();  // nobody leaves (or reads the files) before rank 0 has written them
    return result_;
  }

 private:
  // --lookahead-every: the average of every rank's whole model (the plain model's state,
  // which under DDP and DataParallel is each replica's); not where a rank holds a piece.
  static std::unique_ptr<optim::Lookahead> make_lookahead(const TrainConfig& c, const distributed::ParallelDims& dims,
                                                          ParallelModel& parallel) {
    if (c.optim.lookahead_every == 0) return nullptr;
    LOOM_CHECK(!dims.pp_enabled() && !dims.dp_shard_enabled() && !dims.tp_enabled() && !dims.mp_enabled() &&
                   !c.parallel.zero_redundancy_optimizer,
               "--lookahead-every averages each rank's whole model: one process, --mode dp or ddp (--dp-replicate); "
               "got ", dims.str(), c.parallel.zero_redundancy_optimizer ? " with ZeRO-1" : "",
               ", where a rank holds a piece of the model or of its state (docs/limitations.md)");
    return std::make_unique<optim::Lookahead>(parallel.model());
  }

  // After optimizer step `step` (counted from 1 over the whole run): Lookahead's update on
  // its schedule (OptimConfig::lookahead_every), and at the run's last step the average
  // taken whole, before that epoch's evaluation and checkpoint.
  void step_lookahead(int64_t step) {
    if (!lookahead_) return;
    const int64_t total = data_.steps_per_epoch * config_.training.epochs;
    const int64_t every = config_.optim.lookahead_every;
    if (step % every == 0) {
      const double progress = static_cast<double>(step) / static_cast<double>(total);
      lookahead_->update(std::pow(config_.optim.lookahead_decay, static_cast<double>(every)) * std::pow(progress, 3.0));
    }
    if (step == total) lookahead_->update(1.0);  // the model ends as the average
  }

  // The model on its device, with --init's weights, before parallelize cuts or wraps it.
  static std::shared_ptr<nn::Module> loaded(std::shared_ptr<nn::Module> model, const TrainConfig& c, Device device) {
    model->to(device);
    if (!c.model.init.empty()) nn::load(*model, c.model.init);
    return model;
  }
  Device device() const { return device_; }

  const TrainConfig& config_;
  Device device_;
  Distributed dist_;
  Loaders data_;
  std::shared_ptr<nn::Module> model_;
  nn::CrossEntropyLoss criterion_;
  ParallelModel parallel_;
  MemoryFormat input_format_;
  double lr_;
  BuiltOptimizer optimizer_;  // optimizer_.optimizer is what the loop steps
  std::unique_ptr<optim::LRScheduler> scheduler_;
  MixedPrecision amp_;
  std::unique_ptr<optim::Lookahead> lookahead_;  // --lookahead-every; null without
  Checkpointer checkpointer_;
  std::optional<GradClipper> clipper_;  // --clip-grad-norm
  std::function<void()> clip_;          // clipper_->clip(amp_) before each optimizer step; empty without it
  TrainingPosition position_;
  TrainResult result_;
  StepTimes times_;
};

}  // namespace

std::vector<DeviceMemoryEstimate> estimate_memory_of(const TrainConfig& config, distributed::World* world) {
  check_train_config(config);
  Trainer trainer(config, world);
  // With ranks as threads, the shape-only switch is the process's: no rank turns it on
  // while another still builds its trainer for real, and none tears its connections down
  // while another is in the last collective.
  trainer.barrier();
  std::vector<DeviceMemoryEstimate> estimates = trainer.measure_memory();
  trainer.barrier();
  return estimates;
}

TrainResult train_cifar10(const TrainConfig& config) {
  check_train_config(config);  // the flag table's rules, whether the config came from flags or code
  if (config.training.threads > 0) omp_set_num_threads(static_cast<int>(config.training.threads));
  trace::set_thread_name("train");  // this thread's row in a LOOM_TRACE picture
  manual_seed(config.training.seed);  // before the data and the model draw anything
  // Before anything is allocated: --dp-devices / --mp-devices count the devices after
  // --device that --mode dp, mp and pipeline use in this process (a cap on an unused
  // virtual device changes nothing).
  // --estimate-memory: no budget, so that a strategy past it is measured all the same.
  if (!config.training.estimate_memory)
    apply_device_memory_limit(config.training.device_memory_limit, process_device(config),
                              std::max({config.parallel.dp_devices, config.parallel.mp_devices, int64_t{1}}));
  // Outside the try: on an error the trainer is destroyed while it unwinds, when its
  // process group is left alone (Distributed::~Distributed) instead of waiting for ranks.
  std::optional<Trainer> trainer;
  int64_t first_step = -1;
  try {
    trainer.emplace(config);  // the data, the parallelized model, the optimizer, the checkpointer; resumed
    if (config.training.estimate_memory) return trainer->estimate_memory();
    if (config.training.eval_only) return trainer->evaluate_only();
    first_step = trainer->position().global_step;
    for (int64_t epoch = trainer->position().epoch; epoch < config.training.epochs; ++epoch)
      if (!trainer->train_epoch(epoch)) break;  // --max-steps reached
    return trainer->finish();
  } catch (const OutOfMemoryError& e) {
    // The first two steps find out whether the strategy fits (the second is the first with
    // the optimizer's state); an error after them is not about the strategy.
    if (config.training.estimate_memory || config.training.eval_only ||
        (trainer && first_step >= 0 && trainer->position().global_step >= first_step + 2))
      throw;
    throw_with_advice(e, config);  // Note [Advice after an out-of-memory error]
  }
}

void write_metrics_json(const TrainResult& r, const std::string& path) {
  char json[512];
  std::snprintf(json, sizeof(json),
                "{\"train_loss\": %.6f, \"train_acc\": %.6f, \"test_loss\": %.6f, \"test_acc\": %.6f, "
                "\"test_images\": %lld, \"img_per_s\": %.3f, \"median_step_s\": %.6f, \"peak_memory_mib\": %.1f, "
                "\"model_state_mib\": %.1f, \"steps\": %lld, \"epochs\": %lld, ",
                r.train_loss, r.train_acc, r.test_loss, r.test_acc, static_cast<long long>(r.test_images), r.img_per_s,
                r.median_step_s, static_cast<double>(r.peak_memory_bytes) / (1 << 20),
                static_cast<double>(r.model_state_bytes) / (1 << 20), static_cast<long long>(r.steps),
                static_cast<long long>(r.epochs));
  // Rank 0's collectives per training step, by kind (docs/communication.md has each mode's formula).
  const std::string text = std::string(json) + "\"comm_bytes_per_step\": " +
                           distributed::traffic_json(r.comm, std::max<int64_t>(r.comm_steps, 1)) + "}\n";
  write_file_atomically(path, text, "--metrics-json");  // readers never see half a file
}

}  // namespace loom::training
