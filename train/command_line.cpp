#include "train/command_line.h"

#include <cstdio>
#include <sstream>

#include "core/error.h"            // defines: loom::Error, reported as one line
#include "train/conv_benchmark.h"  // defines: --conv-benchmark (Note [Kernel autotuning])
#include "train/flags.h"           // defines: Flags (--help is generated)
#include "train/model_spec.h"      // defines: model_names (--model)

namespace loom::training {

namespace {

// --balance cost | time | 4,3,4,3: how to cut, or the layer counts themselves.
void parse_balance(const std::string& text, TrainConfig& c) {
  if (text == "cost" || text == "time") {
    c.balance_by = text;
    return;
  }
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
    }
    LOOM_CHECK(used == item.size() && !item.empty(), "--balance: expected cost, time or comma-separated layer counts "
               "such as 7,7, got '", text, "'");
    c.balance.push_back(value);
  }
}

std::string joined_model_names() {
  std::string list;  // every registered model (train/model_spec.h), family by family
  for (const std::string& name : model_names()) list += (list.empty() ? "" : " | ") + name;
  return list;
}

// The table, bound to a TrainConfig and to the few values that are not fields as they are
// typed (turned into fields by parse_train_flags).
struct CommandLine {
  TrainConfig c;
  std::string data, balance = c.balance_by;
  int64_t seed = static_cast<int64_t>(c.seed), chunks = c.microbatches;
  bool no_augment = !c.augment, no_shuffle = !c.shuffle, quiet = !c.progress;
  Flags flags;
  ConvBenchmarkFlags conv_benchmark;

  CommandLine();
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;
};

CommandLine::CommandLine()
    : flags("train_cifar10", "Trains a model on CIFAR-10 (ResNet18, CIFAR variant, by default; other ResNets and "
              "ViTs with --model) in any parallel mode, as examples/reference/train_ddp.py does with PyTorch.") {
  flags.section("data");
  flags.bind("data", data, "CIFAR-10 binary folder (else $LOOM_DATA, else data/, else ../shared/data/)");
  flags.bind("synthetic", c.synthetic, "random CIFAR-shaped data (throughput without I/O)");
  flags.bind("batch-size", c.batch_size, "images per step (per process)");
  flags.bind("workers", c.workers, "DataLoader worker threads");
  flags.bind("no-augment", no_augment, "no random crop/flip");
  flags.bind("no-shuffle", no_shuffle, "sequential training order");
  flags.bind("eval-limit", c.eval_limit, "evaluate on at most N test images (-1: all)");

  flags.section("model");
  flags.bind("model", c.model, joined_model_names() + " (ResNets with the CIFAR stem)");
  flags.bind("init", c.init, "load weights (safetensors) before training");
  flags.bind("seed", seed, "seed for init, shuffling, augmentation");

  flags.section("optimizer and schedule");
  flags.bind("epochs", c.epochs, "passes over the training set");
  flags.bind("max-steps", c.max_steps, "stop after this many optimizer steps (-1: no limit)");
  flags.bind("optimizer", c.optimizer,
             "sgd | adamw (AdamW: --weight-decay decoupled, none on biases, norms and embeddings)");
  flags.bind("lr", c.lr, "learning rate");
  flags.bind("momentum", c.momentum, "SGD momentum");
  flags.bind("weight-decay", c.weight_decay, "L2 penalty (AdamW: decoupled decay)");
  flags.bind("nesterov", c.nesterov, "Nesterov momentum");
  flags.bind("label-smoothing", c.label_smoothing, "cross-entropy label smoothing");
  flags.bind("schedule", c.schedule, "LR schedule: none | cosine | onecycle | warmup_cosine (linear warm-up, then cosine)");
  flags.bind("warmup-epochs", c.warmup_epochs, "warmup_cosine: epochs of warm-up");
  flags.bind("clip-grad-norm", c.clip_grad_norm,
             "clip the gradients' 2-norm (over the whole model, however it is cut) to this before each step; 0: no");
  flags.bind("lr-scaling", c.lr_scaling, "none | linear (lr x data-parallel replicas: the world size under ddp)");

  flags.section("device and precision");
  flags.bind("device", c.device, "cpu | cpu:N | cuda | cuda:N");
  flags.bind("threads", c.threads, "compute threads (0: OpenMP's default)");
  flags.bind("device-memory-limit", c.device_memory_limit,
             "cap on each training device's reserved memory, e.g. 1.5GiB (per rank; OutOfMemoryError past it)");
  flags.bind("amp", c.amp, "mixed precision: none | bf16 | fp16 (autocast; fp16 adds a GradScaler)");
  flags.bind("memory-format", c.memory_format,
             "auto | contiguous | channels_last: the images' layout (auto: channels_last on the CPU under --amp bf16, "
             "and in float32 without AVX-512)");
  flags.bind("activation-checkpoint", c.activation_checkpoint,
             "none | full | selective: keep only each residual block's (encoder layer's) input and recompute its "
             "activations in backward, for every block or every --selective-ac-option-th (docs/memory.md)");
  flags.bind("selective-ac-option", c.selective_ac_option,
             "--activation-checkpoint selective: checkpoint every N-th block");
  flags.bind("estimate-memory", c.estimate_memory,
             "print each rank's predicted peak memory for these flags (shape-only steps: allocations without "
             "arithmetic) and exit without training (docs/memory.md)");
  conv_benchmark = add_conv_benchmark_flags(flags);

  flags.section("checkpoints and metrics");
  flags.bind("save", c.save, "write final weights (safetensors)");
  flags.bind("checkpoint-dir", c.checkpoint_dir, "write full training state here");
  flags.bind("checkpoint-every", c.checkpoint_every,
             "steps between checkpoints (also at each epoch end; 0: only then)");
  flags.bind("resume", c.resume, "continue from --checkpoint-dir exactly");
  flags.bind("checkpoint-format", c.checkpoint_format,
             "full (FULL_STATE_DICT: one file gathered on rank 0, loads at any world size) | sharded (a file per rank "
             "+ a manifest, each piece with its place in the whole tensor: resumes under any other world size and "
             "layout, as torch.distributed.checkpoint) (default: sharded under --dp-shard, --pp, --tp or "
             "--zero-redundancy-optimizer, else full)");
  flags.bind("eval-only", c.eval_only, "evaluate --init on the test set and exit");
  flags.bind("metrics-json", c.metrics_json, "write final metrics as JSON");
  flags.bind("quiet", quiet, "no progress bar");

  flags.section("parallelism: degrees across processes (under loomrun)");
  flags.bind("pp", c.pp, "degree: pipeline stages as processes, one per rank, under loomrun");
  flags.bind("dp-replicate", c.dp_replicate,
             "degree: replicas of the model or of each stage (DistributedDataParallel; 0: --mode's preset)");
  flags.bind("dp-shard", c.dp_shard,
             "degree: shards of the model (FullyShardedDataParallel; -1: what the world leaves; 0: --mode's preset)");
  flags.bind("tp", c.tp, "degree: tensor-parallel ranks, each block's layers split over them (docs/tensor_parallel.md)");
  flags.bind("mode", c.mode,
             "single | dp (DataParallel: one process, several devices) | mp (layer-wise model parallel) | pipeline "
             "(micro-batches over the mp stages) | ddp (DistributedDataParallel; start with loomrun) | fsdp "
             "(FullyShardedDataParallel; start with loomrun)");
  flags.bind("backend", c.backend, "ddp: gloo | nccl (default: nccl on cuda, gloo on cpu)");
  flags.bind("sync-bn", c.sync_bn, "ddp: BatchNorm statistics over every rank (SyncBatchNorm)");
  flags.bind("bucket-cap-mb", c.bucket_cap_mb, "ddp: gradient bucket size in MiB");
  flags.bind("zero-redundancy-optimizer", c.zero_redundancy_optimizer,
             "ddp: ZeRO-1, each rank keeps and steps the optimizer state of 1/N of the parameters");
  flags.bind("sharding-strategy", c.sharding_strategy, "fsdp: full_shard | shard_grad_op | no_shard | hybrid_shard");
  flags.bind("shard-group-size", c.shard_group_size, "fsdp hybrid_shard: ranks per shard group (divides the world)");
  flags.bind("reshard-after-forward", c.reshard_after_forward,
             "--dp-shard: default | always | never: free each unit's parameters after its forward (default: always, "
             "never under --pp, where a stage's units stay gathered through the step's micro-batches)");
  flags.bind("fsdp-layout", c.fsdp_layout,
             "--dp-shard: per_parameter (FSDP2's fully_shard: each parameter cut on dim 0, so --optimizer adamw keeps "
             "its weight-decay groups) | flat (FSDP1: each unit's parameters as one flat tensor, cut in equal ranges)");

  flags.section("parallelism: pipelines (--pp, --mode pipeline) and devices in one process");
  flags.bind("microbatches", c.microbatches, "pipeline: micro-batches per batch (PyTorch pipelining's n_microbatches)");
  flags.bind("chunks", chunks, "pipeline: --microbatches by torchgpipe's name");
  flags.bind("pipeline-schedule", c.pipeline_schedule, "pipeline: gpipe | 1f1b | interleaved_1f1b");
  flags.bind("virtual-stages", c.virtual_stages, "pipeline, interleaved_1f1b: model chunks per stage (V)");
  flags.bind("balance", balance,
             "pipeline: where to cut the model: cost (counted FLOPs and bytes: the same every run), time (measured "
             "once, on rank 0), or layers per virtual stage a,b,... (stages x V entries adding up to the model's "
             "Sequential: 14 for resnet18)");
  flags.bind("pipeline-checkpoint", c.pipeline_checkpoint,
             "pipeline: never | except_last | always (recompute each micro-batch's activations in its backward: less "
             "memory)");
  flags.bind("mp-devices", c.mp_devices, "mp, pipeline: stages, one device each");
  flags.bind("dp-devices", c.dp_devices,
             "dp: devices (0: every GPU with --device cuda, 2 on cpu: cpu:0 and cpu:1)");
}

}  // namespace

TrainConfig parse_train_flags(int argc, char** argv) {
  CommandLine line;
  TrainConfig& c = line.c;
  line.flags.parse(argc, argv);
  apply_conv_benchmark_flags(line.conv_benchmark);

  if (!line.data.empty()) c.data = line.data;
  c.seed = static_cast<uint64_t>(line.seed);
  c.augment = !line.no_augment;
  c.shuffle = !line.no_shuffle;
  c.progress = !line.quiet;
  LOOM_CHECK(!line.flags.given("chunks") || !line.flags.given("microbatches") || line.chunks == c.microbatches,
             "--chunks ", line.chunks, " and --microbatches ", c.microbatches,
             " are one setting (micro-batches per batch) given twice; keep one");
  if (line.flags.given("chunks")) c.microbatches = line.chunks;
  parse_balance(line.balance, c);
  LOOM_CHECK(!c.eval_only || !c.init.empty() || c.resume, "--eval-only needs --init PATH (or --resume)");
  return c;
}

std::vector<Flags::Info> train_flags() {
  CommandLine line;
  return line.flags.list();
}

int train_main(int argc, char** argv) {
  try {
    train_cifar10(parse_train_flags(argc, argv));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "train_cifar10: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace loom::training
