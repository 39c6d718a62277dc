// The CIFAR-10 training loop behind examples/train_cifar10, as a function so that tests
// can run it (resume equivalence) and the parallel modes can share it.
//
// One step is the loop every PyTorch user knows:
//   output = model(images); loss = criterion(output, labels);
//   optimizer.zero_grad(); loss.backward(); optimizer.step(); scheduler.step()
//
// --mode ddp (under loomrun) runs the same loop in every process, with the model wrapped
// in DistributedDataParallel and each process on its shard of every epoch; what changes
// is in train/distributed.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/traffic.h"  // defines: Traffic (the bytes each collective moved)

namespace loom::training {

// The run's settings, in sections as torchtitan's JobConfig (and as --help groups the
// flags: train/command_line.cpp binds each flag to one field here, whose value is its
// default). A program or test fills one and calls train_cifar10(config).
struct ModelConfig {
  std::string name = "resnet18";  // a registered ModelSpec's name (train/model_spec.h); tiny: a narrow ResNet
  std::string init;               // safetensors weights to start from
  // none | full | selective: recompute each block's activations in its backward (every
  // block, or every selective_ac_option-th): apply_ac, train/parallelize.h.
  std::string activation_checkpoint = "none";
  int64_t selective_ac_option = 2;
};

struct DataConfig {
  std::optional<std::string> root;  // CIFAR-10 folder; see data::find_cifar10_root
  bool synthetic = false;           // random CIFAR-shaped data: throughput without I/O
  int64_t synthetic_size = 50000;
  int64_t batch_size = 128;  // per process
  int64_t workers = 2;
  bool augment = true;  // the training images' crop and flip below (none of either when false)
  // RandomCrop(32, crop_padding, padding_mode): a translation by up to crop_padding pixels;
  // constant (zeros, torchvision's default) | reflect (airbench's "reflect translate").
  int64_t crop_padding = 4;
  std::string padding_mode = "constant";
  // random (RandomHorizontalFlip) | alternating (Note [Alternating flip]) | none.
  std::string flip = "random";
  bool shuffle = true;
  int64_t eval_limit = -1;  // evaluate on at most this many test images; -1: all
};

struct OptimConfig {
  std::string name = "sgd";  // sgd | adamw (weight decay decoupled; none on biases, norms, embeddings)
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  // SGD: no weight decay on biases and normalisation layers' parameters (AdamW always
  // exempts them; timm's filter_bias_and_bn).
  bool no_decay_norms_and_biases = false;
  bool nesterov = false;
  double label_smoothing = 0.0;
  std::string schedule = "none";  // none | cosine | onecycle | warmup_cosine (stepped every optimizer step)
  double warmup_epochs = 1;       // warmup_cosine: epochs of linear warm-up before the cosine
  double clip_grad_norm = 0;      // > 0: clip the whole model's gradient 2-norm to it before each step
  // Lookahead (nn/optim/lookahead.h), as the CIFAR-10 speedruns: every lookahead_every
  // steps the average of the model's state (weights and BatchNorm statistics) moves toward
  // the model by 1 - decay, with decay = lookahead_decay^every x (step / total steps)^3,
  // and the model takes the average; at the run's last step the model takes the average
  // whole. 0: off.
  int64_t lookahead_every = 0;
  double lookahead_decay = 0.95;
  std::string lr_scaling = "none";  // none | linear (lr x data-parallel replicas: the global batch grew)
};

struct TrainingConfig {
  int64_t epochs = 3;
  int64_t max_steps = -1;  // stop after this many optimizer steps (all epochs); -1: no limit
  uint64_t seed = 0;
  std::string device = "cpu";
  int64_t threads = 0;                 // OpenMP threads for compute; 0 = the runtime's default
  std::string device_memory_limit;     // "1.5GiB": a budget per device of this process (train/device.h); "": none
  std::string amp = "none";            // none | bf16 | fp16 (train/mixed_precision.h)
  std::string memory_format = "auto";  // auto | contiguous | channels_last (train/device.h)
  bool eval_only = false;
  // Test-time augmentation of every evaluation: none | mirror | mirror_translate (six views,
  // the speedruns' weights; nn/test_time_augmentation.h, Note [TTA weights]).
  std::string tta = "none";
  // Print each rank's predicted peak memory instead of training: shape-only steps
  // (train/estimate_memory.h).
  bool estimate_memory = false;
};

struct ParallelConfig {
  // One process on one device by default. dp: DataParallel, one process over dp_devices
  // devices (parallel/data_parallel.h); ddp, fsdp: presets of the degrees below, one
  // process per device under loomrun (train/degrees.h). mp: the model cut into stages on
  // mp_devices devices (parallel/model_parallel.h); pipeline: those stages on threads of
  // their own, over micro-batches (parallel/pipeline/pipeline.h).
  std::string mode = "single";       // single | dp | mp | pipeline | ddp | fsdp
  int64_t dp_devices = 0;            // dp: devices to use; 0 = every GPU (cuda), 2 (cpu)
  int64_t mp_devices = 2;            // mp, pipeline: stages, one device each
  // The degrees across processes (train/degrees.h): 0 = not given (mode's preset).
  int64_t pp = 1;                    // pipeline stages as processes (under loomrun), one per rank
  int64_t dp_replicate = 0;          // replicas (DistributedDataParallel)
  int64_t dp_shard = 0;              // shards (FullyShardedDataParallel); -1: what the world leaves
  int64_t tp = 1;                    // tensor-parallel ranks
  // Pipelines (pp > 1, mode pipeline).
  int64_t microbatches = 4;                   // micro-batches per batch (torchgpipe's chunks)
  std::string pipeline_schedule = "1f1b";     // gpipe | 1f1b | interleaved_1f1b
  int64_t virtual_stages = 1;                 // interleaved_1f1b: virtual stages per stage (V)
  std::vector<int64_t> balance;               // layers per virtual stage (stages x V); empty: by balance_by
  std::string balance_by = "cost";            // cost | time (Note [Stage balance], parallel/balance.h)
  std::string pipeline_checkpoint = "never";  // never | except_last | always (recompute activations)
  // Data parallelism across processes.
  std::string backend;                           // gloo | nccl; "" = nccl on CUDA, gloo on CPU
  // How long the rendezvous and every collective wait for the other ranks before failing
  // (init_process_group's timeout; Note [Nothing hangs forever], communicator.h).
  double comm_timeout_s = 300;
  bool sync_bn = false;                          // BatchNorm2d statistics over every data-parallel rank
  double bucket_cap_mb = 25;                     // DDP's gradient bucket size
  bool zero_redundancy_optimizer = false;        // ZeRO-1, each rank the optimizer state of its partition
  std::string sharding_strategy = "full_shard";  // full_shard | shard_grad_op | no_shard | hybrid_shard
  int64_t shard_group_size = 0;                  // hybrid_shard: ranks per shard group (must divide the world)
  // default | always | never (torchtitan's fsdp_reshard_after_forward): free a unit's
  // parameters after its forward. default: always, but never under pp, where a stage's
  // units stay gathered through the step's micro-batches.
  std::string reshard_after_forward = "default";
  // flat (FSDP1: each unit's parameters in one buffer cut in N) | per_parameter (FSDP2's
  // fully_shard: every parameter cut on dim 0, stepped under its own name).
  std::string fsdp_layout = "per_parameter";
};

struct CheckpointConfig {
  std::string save;     // write the final weights here (safetensors)
  std::string dir;      // full training state, written every `every` steps and each epoch
  int64_t every = 100;  // 0: only at epoch ends (and when max_steps stops the run)
  bool resume = false;
  // full | sharded (PyTorch's FULL_STATE_DICT | SHARDED_STATE_DICT); "": sharded where the
  // ranks hold different state, full elsewhere. Note [Sharded checkpoints in train_cifar10].
  std::string format;
};

struct MetricsConfig {
  std::string json;      // write the final metrics here
  bool progress = true;  // the progress bar and set-up lines
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  TrainingConfig training;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  // --recipe's file (train/recipe.h), and the settings after it and the command line as a
  // recipe (parse_train_flags fills both; "" for a config filled in code).
  std::string recipe;
  std::string effective_toml;
};

struct TrainResult {
  double train_loss = 0, train_acc = 0, test_loss = 0, test_acc = 0;
  int64_t test_images = 0;  // how many test images the last evaluation counted (every rank)
  double img_per_s = 0;  // training images per second over the timed steps (all ranks)
  double median_step_s = 0;  // the median time of a timed step (rank 0's, under ddp)
  // The most --device's allocator had handed out in this process: every CPU device shares
  // one allocator; on GPUs it is --device's alone (dp, mp, pipeline: not the others').
  int64_t peak_memory_bytes = 0;
  // This rank's parameters + gradients + optimizer state at the end of its last step
  // (nn::model_state_bytes): what ZeRO and FSDP shard; activations are not in it.
  int64_t model_state_bytes = 0;
  int64_t steps = 0;     // optimizer steps taken in total (including before a resume)
  int64_t epochs = 0;    // epochs completed
  // What this process's collectives moved inside its training steps (bytes per kind, as
  // nccl-tests count them: parallel/comm/traffic.h), over comm_steps steps of this run.
  distributed::Traffic comm;
  int64_t comm_steps = 0;
};

TrainResult train_cifar10(const TrainConfig& config);

// {"train_loss": ..., ...} written atomically.
void write_metrics_json(const TrainResult& result, const std::string& path);

}  // namespace loom::training
