#include "examples/speedrun/airbench94.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include "autograd/autocast.h"          // defines: autocast::Guard (--amp bf16)
#include "autograd/grad_mode.h"
#include "autograd/ops.h"               // defines: cross_entropy
#include "core/factory.h"               // defines: scalar_tensor
#include "core/memory.h"                // defines: resident_memory, memory_stats, reset_peak_memory_stats
#include "core/generator.h"             // defines: manual_seed
#include "data/cifar10.h"               // defines: CIFAR10
#include "data/sampler.h"               // defines: sequential_indices
#include "data/transforms.h"            // defines: Compose, ToTensor, Normalize
#include "nn/optim/lookahead.h"         // defines: Lookahead
#include "nn/optim/lr_scheduler.h"      // defines: LambdaLR, interp
#include "nn/optim/sgd.h"               // defines: SGD
#include "nn/whitening.h"               // defines: init_whitening_conv_
#include "parallel/ddp/distributed_data_parallel.h"  // defines: DistributedDataParallel

namespace loom::examples {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Wall time spent in one phase, summed over its visits.
struct PhaseTimer {
  double& total;
  Clock::time_point start = Clock::now();
  ~PhaseTimer() { total += seconds_since(start); }
};

void log_line(const Airbench94Config& config, const std::string& line) {
  if (config.log) config.log(line);
}

// Records the memory at the end of `phase` and starts the allocator's peaks afresh for the next.
void record_memory(Airbench94Result& result, const char* phase) {
  const Device cpu("cpu");
  const ResidentMemory resident = resident_memory();
  const AllocatorStats stats = memory_stats(cpu);
  result.memory.push_back({.phase = phase, .resident = resident.current, .peak_resident = resident.peak,
                           .allocated = stats.allocated_bytes, .reserved = stats.reserved_bytes,
                           .peak_allocated = stats.peak_allocated_bytes, .peak_reserved = stats.peak_reserved_bytes,
                           .system_allocations = stats.system_allocations});
  reset_peak_memory_stats(cpu);
}

// The bytes of the distinct storages behind `tensors` (views of one storage count once).
int64_t storage_bytes(std::initializer_list<const Tensor*> tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const Tensor* t : tensors)
    if (t->defined() && seen.insert(t->storage().get()).second) bytes += static_cast<int64_t>(t->storage()->nbytes());
  return bytes;
}

}  // namespace

CifarTensors load_cifar10_tensors(const std::string& root, bool train, MemoryFormat format) {
  namespace T = data::transforms;
  auto transform = std::make_shared<T::Compose>(
      T::ToTensor(), T::Normalize({0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}));
  data::CIFAR10 dataset(root, train, transform);
  const std::vector<int64_t> all = data::sequential_indices(dataset.size());
  data::Batch batch = dataset.get_batch(all, {});
  return {batch.data.contiguous(format), batch.target.to(kInt64)};
}

int64_t airbench94_total_steps(const Airbench94Config& config, int64_t train_size) {
  const int64_t per_epoch = train_size / config.batch_size;
  LOOM_CHECK(per_epoch > 0, "airbench94: ", train_size, " training images make no batch of ", config.batch_size);
  return static_cast<int64_t>(std::ceil(static_cast<double>(per_epoch) * config.epochs));
}

Airbench94Result run_airbench94(const Airbench94Config& config, const CifarTensors& train, const CifarTensors& test) {
  const int64_t world_size = config.process_group ? config.process_group->size() : 1;
  const int64_t rank = config.process_group ? config.process_group->rank() : 0;
  Airbench94Result result;
  manual_seed(config.seed);
  auto net = nn::airbench94();

  data::InMemoryLoader loader(train.images, train.labels,
                              {.batch_size = config.batch_size, .shuffle = true, .drop_last = true,
                               .flip = config.flip, .translate = config.translate, .seed = config.seed,
                               .rank = rank, .world_size = world_size, .memory_format = config.memory_format});
  const int64_t total_steps = airbench94_total_steps(config, train.images.size(0));
  const int64_t steps = config.max_steps >= 0 ? std::min(config.max_steps, total_steps) : total_steps;
  const int64_t whiten_bias_steps = config.whiten_bias_epochs * loader.size();

  // The test images in the batches' layout, once, before the clock starts (as the training
  // images are normalised once, untimed); no copy where they come in it.
  const Tensor test_images = test.images.contiguous(config.memory_format);
  result.data_bytes = storage_bytes({&train.images, &train.labels, &test.images, &test.labels, &test_images});
  record_memory(result, "data");

  const Clock::time_point start = Clock::now();
  {  // Whitening: the first conv's filters from the first images' patches (nn/whitening.h).
    PhaseTimer timer{result.whitening_s};
    const int64_t n = std::min(config.whiten_images, train.images.size(0));
    nn::init_whitening_conv_(*net->whiten, train.images.narrow(0, 0, n), config.whiten_eps);
    net->whiten->weight.requires_grad_(false);
  }
  record_memory(result, "whitening");

  // See Note [airbench94's hyperparameters].
  const double kilostep_scale = 1024.0 * (1.0 + 1.0 / (1.0 - config.momentum));
  const double lr = config.lr / kilostep_scale;
  const double decay_per_step = config.weight_decay * static_cast<double>(config.batch_size) / kilostep_scale;
  const double lr_biases = lr * config.bias_scaler;
  const nn::AirbenchParams params = nn::airbench_param_split(*net);
  std::vector<optim::ParamGroup> groups = {
      {params.norm_biases, {{"lr", lr_biases}, {"weight_decay", decay_per_step / lr_biases}}},
      {params.others, {{"lr", lr}, {"weight_decay", decay_per_step / lr}}}};
  optim::SGD optimizer(std::move(groups), {.momentum = config.momentum, .nesterov = true});
  const double T = static_cast<double>(total_steps);
  optim::LambdaLR scheduler(optimizer, [&config, T](int64_t step) {
    return optim::interp(static_cast<double>(step), {0, config.lr_peak_at * T, T},
                         {config.lr_start, 1.0, config.lr_end});
  });
  optim::Lookahead lookahead(*net);

  std::shared_ptr<nn::Module> model = net;
  if (world_size > 1)  // the whitening bias stops training mid-run: find_unused_parameters
    model = std::make_shared<ddp::DistributedDataParallel>(net, config.process_group,
                                                          ddp::DDPOptions{.find_unused_parameters = true});

  int64_t step = 0;
  double untimed_s = 0;  // per-epoch evaluation, left out of the timed total
  for (int64_t epoch = 0; step < steps; ++epoch) {
    model->train();
    Airbench94Epoch record{.epoch = epoch};
    double loss_sum = 0;
    const Clock::time_point train_start = Clock::now();
    {
      Clock::time_point data_start = Clock::now();
      const data::InMemoryLoader::Epoch batches = loader.epoch(epoch);
      for (auto it = batches.begin(); it != batches.end() && step < steps; ++it) {
        data::Batch& batch = *it;
        result.data_s += seconds_since(data_start);
        net->whiten->bias.requires_grad_(step < whiten_bias_steps);
        Tensor loss;
        {
          std::optional<autocast::Guard> amp;
          if (config.bf16) amp.emplace(DeviceType::CPU, kBFloat16);
          loss = cross_entropy(model->forward(batch.data), batch.target, Tensor(), Reduction::Sum, -100,
                               config.label_smoothing);
        }
        optimizer.zero_grad(true);
        loss.backward();
        optimizer.step();
        scheduler.step();
        ++step;
        if (step == 1) record_memory(result, "first step");
        const double per_example = loss.item<float>() / static_cast<double>(batch.size());
        loss_sum += per_example;
        result.train_loss_last = per_example;
        ++record.steps;
        if (step % config.lookahead_every == 0) {
          PhaseTimer timer{result.lookahead_s};
          lookahead.update(std::pow(config.lookahead_decay, config.lookahead_every) * std::pow(step / T, 3.0));
        }
        data_start = Clock::now();
      }
    }
    if (step >= steps) {  // the average is the model the run ends with
      PhaseTimer timer{result.lookahead_s};
      lookahead.update(1.0);
    }
    result.train_s += seconds_since(train_start);
    record.train_loss = record.steps ? loss_sum / static_cast<double>(record.steps) : 0;
    record.elapsed_s = seconds_since(start) - untimed_s;
    if (config.eval_every_epoch) {
      const Clock::time_point eval_start = Clock::now();
      model->eval();
      record.accuracy = nn::tta_accuracy(*net, test_images, test.labels, nn::TTA::none, config.eval_batch_size);
      untimed_s += seconds_since(eval_start);
    }
    result.per_epoch.push_back(record);
    char line[200];
    const int used = std::snprintf(line, sizeof line, "epoch %2lld  steps %4lld  train_loss %.4f  time %.1f s",
                                   static_cast<long long>(epoch + 1), static_cast<long long>(step), record.train_loss,
                                   record.elapsed_s);
    if (record.accuracy >= 0 && used > 0 && used < static_cast<int>(sizeof line))
      std::snprintf(line + used, sizeof line - static_cast<size_t>(used), "  test_acc %.2f%%", 100 * record.accuracy);
    log_line(config, line);
  }
  result.steps = step;
  record_memory(result, "training");

  {  // The final evaluation: test-time augmentation (nn/test_time_augmentation.h). Under DDP
     // each rank tests its own share of the images and the correct counts are summed.
    PhaseTimer timer{result.tta_s};
    net->eval();
    const int64_t n = test_images.size(0), first = n * rank / world_size, count = n * (rank + 1) / world_size - first;
    const double share = nn::tta_accuracy(*net, test_images.narrow(0, first, count), test.labels.narrow(0, first, count),
                                          config.tta, config.eval_batch_size);
    Tensor correct = scalar_tensor(std::round(share * static_cast<double>(count)), kFloat64);
    if (world_size > 1) config.process_group->all_reduce(correct)->wait();
    result.tta_accuracy = correct.item<double>() / static_cast<double>(n);
  }
  result.wall_time_s = seconds_since(start) - untimed_s;
  record_memory(result, "tta");
  net->eval();
  result.accuracy = nn::tta_accuracy(*net, test_images, test.labels, nn::TTA::none, config.eval_batch_size);
  record_memory(result, "accuracy");
  return result;
}

}  // namespace loom::examples
