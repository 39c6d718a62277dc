// train_cifar10: trains ResNet18 on CIFAR-10 — loom's main job.
//
//   build/examples/train_cifar10 --epochs 1
//   build/examples/train_cifar10 --synthetic --max-steps 50     # throughput, no I/O
//   build/examples/train_cifar10 --checkpoint-dir ckpt --resume # continue exactly
//   build/parallel/loomrun --nproc_per_node 2 build/examples/train_cifar10 --mode ddp [--sync-bn]
//                                                                # one process per device
//   build/examples/train_cifar10 --mode dp --dp-devices 2 --threads 2  # one process, cpu:0 + cpu:1
//   build/examples/train_cifar10 --mode mp --mp-devices 2              # ResNet cut in 2 stages
//   build/examples/train_cifar10 --mode pipeline --microbatches 4 --pipeline-schedule 1f1b --threads 2
//
// This file turns flags into a TrainConfig; the loop itself is examples/train/trainer.cpp.
#include <cstdio>
#include <sstream>
#include <vector>

#include "core/error.h"                  // defines: loom::Error, reported as one line
#include "examples/train/conv_benchmark.h"  // defines: --conv-benchmark (Note [Kernel autotuning])
#include "examples/train/flags.h"        // defines: Flags (--help is generated)
#include "examples/train/trainer.h"      // defines: TrainConfig, train_cifar10

using namespace loom;
using namespace loom::examples;

// --balance cost | time | 4,3,4,3: how to cut, or the layer counts themselves.
static void parse_balance(const std::string& text, TrainConfig& c) {
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

int main(int argc, char** argv) {
  try {
    TrainConfig c;
    Flags flags("train_cifar10", "Trains a model on CIFAR-10 (ResNet18, CIFAR variant, by default; other ResNets and "
                "ViTs with --model) in any parallel mode, as examples/reference/train_ddp.py does with PyTorch.");
    std::string& data = flags.add<std::string>("data", "", "CIFAR-10 binary folder (else $LOOM_DATA, else data/, else ../shared/data/)");
    auto& model = flags.add<std::string>("model", c.model,
        "resnet18 | resnet34 | resnet50 | resnet101 | resnet152 | wide_resnet50_2 | wide_resnet101_2 | tiny "
        "(nn/models.h; CIFAR stem) "
        "| vit_tiny | vit_small");
    auto& epochs = flags.add<int64_t>("epochs", c.epochs, "passes over the training set");
    auto& max_steps = flags.add<int64_t>("max-steps", c.max_steps, "stop after this many optimizer steps (-1: no limit)");
    auto& batch_size = flags.add<int64_t>("batch-size", c.batch_size, "images per step (per process)");
    auto& lr = flags.add<double>("lr", c.lr, "learning rate");
    auto& momentum = flags.add<double>("momentum", c.momentum, "SGD momentum");
    auto& weight_decay = flags.add<double>("weight-decay", c.weight_decay, "L2 penalty (AdamW: decoupled decay)");
    auto& nesterov = flags.add<bool>("nesterov", c.nesterov, "Nesterov momentum");
    auto& smoothing = flags.add<double>("label-smoothing", c.label_smoothing, "cross-entropy label smoothing");
    auto& schedule = flags.add<std::string>("schedule", c.schedule,
        "LR schedule: none | cosine | onecycle | warmup_cosine (linear warm-up, then cosine)");
    auto& warmup_epochs = flags.add<double>("warmup-epochs", c.warmup_epochs, "warmup_cosine: epochs of warm-up");
    auto& clip_grad_norm = flags.add<double>("clip-grad-norm", c.clip_grad_norm,
        "clip the gradients' 2-norm (over the whole model, however it is cut) to this before each step; 0: no");
    auto& optimizer = flags.add<std::string>("optimizer", c.optimizer,
        "sgd | adamw (AdamW: --weight-decay decoupled, none on biases, norms and embeddings)");
    auto& workers = flags.add<int64_t>("workers", c.workers, "DataLoader worker threads");
    auto& threads = flags.add<int64_t>("threads", c.threads, "compute threads (0: OpenMP's default)");
    auto& seed = flags.add<int64_t>("seed", static_cast<int64_t>(c.seed), "seed for init, shuffling, augmentation");
    auto& device = flags.add<std::string>("device", c.device, "cpu | cpu:N | cuda | cuda:N");
    auto& device_memory_limit = flags.add<std::string>("device-memory-limit", c.device_memory_limit,
        "cap on each training device's reserved memory, e.g. 1.5GiB (per rank; OutOfMemoryError past it)");
    auto& amp = flags.add<std::string>("amp", c.amp, "mixed precision: none | bf16 | fp16 (autocast; fp16 adds a GradScaler)");
    auto& memory_format = flags.add<std::string>(
        "memory-format", c.memory_format,
        "auto | contiguous | channels_last: the images' layout (auto: channels_last on the CPU under --amp bf16, and in float32 without AVX-512)");
    auto& no_augment = flags.add<bool>("no-augment", false, "no random crop/flip");
    auto& no_shuffle = flags.add<bool>("no-shuffle", false, "sequential training order");
    auto& init = flags.add<std::string>("init", "", "load weights (safetensors) before training");
    auto& save = flags.add<std::string>("save", "", "write final weights (safetensors)");
    auto& checkpoint_dir = flags.add<std::string>("checkpoint-dir", "", "write full training state here");
    auto& checkpoint_every = flags.add<int64_t>("checkpoint-every", 100, "steps between checkpoints (also at each epoch end; 0: only then)");
    auto& resume = flags.add<bool>("resume", false, "continue from --checkpoint-dir exactly");
    auto& checkpoint_format = flags.add<std::string>(
        "checkpoint-format", "", "full (FULL_STATE_DICT: one file gathered on rank 0, loads at any world size) | "
        "sharded (a file per rank + a manifest, each piece with its place in the whole tensor: resumes under any "
        "other world size and layout, as torch.distributed.checkpoint) "
        "(default: sharded under --dp-shard, --pp, --tp or --zero-redundancy-optimizer, else full)");
    auto& eval_only = flags.add<bool>("eval-only", false, "evaluate --init on the test set and exit");
    auto& synthetic = flags.add<bool>("synthetic", false, "random CIFAR-shaped data (throughput without I/O)");
    auto& eval_limit = flags.add<int64_t>("eval-limit", -1, "evaluate on at most N test images (-1: all)");
    auto& metrics_json = flags.add<std::string>("metrics-json", "", "write final metrics as JSON");
    auto& quiet = flags.add<bool>("quiet", false, "no progress bar");
    auto& estimate_memory = flags.add<bool>(
        "estimate-memory", false, "print each rank's predicted peak memory for these flags (shape-only steps: "
        "allocations without arithmetic) and exit without training (docs/memory.md)");
    auto& mode = flags.add<std::string>("mode", c.mode, "single | dp (DataParallel: one process, several devices) | "
                                        "mp (layer-wise model parallel) | pipeline (micro-batches over the mp "
                                        "stages) | ddp (DistributedDataParallel; start with loomrun) | fsdp "
                                        "(FullyShardedDataParallel; start with loomrun)");
    auto& mp_devices = flags.add<int64_t>("mp-devices", c.mp_devices, "mp, pipeline: stages, one device each");
    auto& microbatches = flags.add<int64_t>("microbatches", c.microbatches, "pipeline: micro-batches per batch "
                                            "(PyTorch pipelining's n_microbatches)");
    auto& chunks = flags.add<int64_t>("chunks", c.microbatches, "pipeline: --microbatches by torchgpipe's name");
    auto& schedule_name = flags.add<std::string>("pipeline-schedule", c.pipeline_schedule,
                                                 "pipeline: gpipe | 1f1b | interleaved_1f1b");
    auto& virtual_stages = flags.add<int64_t>("virtual-stages", c.virtual_stages, "pipeline, interleaved_1f1b: model "
                                              "chunks per stage (V)");
    auto& balance = flags.add<std::string>("balance", c.balance_by, "pipeline: where to cut the model: cost (counted "
                                           "FLOPs and bytes: the same every run), time (measured once, on rank 0), or "
                                           "layers per virtual stage a,b,... (stages x V entries adding up to the "
                                           "model's Sequential: 14 for resnet18)");
    auto& pp = flags.add<int64_t>("pp", c.pp, "degree: pipeline stages as processes, one per rank, under loomrun");
    auto& dp_replicate = flags.add<int64_t>("dp-replicate", c.dp_replicate, "degree: replicas of the model or of each "
                                            "stage (DistributedDataParallel; 0: --mode's preset)");
    auto& dp_shard = flags.add<int64_t>("dp-shard", c.dp_shard, "degree: shards of the model (FullyShardedDataParallel; "
                                        "-1: what the world leaves; 0: --mode's preset)");
    auto& tp = flags.add<int64_t>("tp", c.tp, "degree: tensor-parallel ranks, each block's layers split over them (docs/tensor_parallel.md)");
    auto& pipeline_checkpoint = flags.add<std::string>("pipeline-checkpoint", c.pipeline_checkpoint,
                                                       "pipeline: never | except_last | always (recompute each "
                                                       "micro-batch's activations in its backward: less memory)");
    auto& activation_checkpoint = flags.add<std::string>(
        "activation-checkpoint", c.activation_checkpoint,
        "none | full | selective: keep only each residual block's (encoder layer's) input and recompute its "
        "activations in backward, for every block or every --selective-ac-option-th (docs/memory.md)");
    auto& selective_ac_option = flags.add<int64_t>("selective-ac-option", c.selective_ac_option,
                                                   "--activation-checkpoint selective: checkpoint every N-th block");
    auto& dp_devices = flags.add<int64_t>("dp-devices", c.dp_devices, "dp: devices (0: every GPU with --device cuda, "
                                          "2 on cpu: cpu:0 and cpu:1)");
    auto& backend = flags.add<std::string>("backend", "", "ddp: gloo | nccl (default: nccl on cuda, gloo on cpu)");
    auto& sync_bn = flags.add<bool>("sync-bn", false, "ddp: BatchNorm statistics over every rank (SyncBatchNorm)");
    auto& lr_scaling = flags.add<std::string>("lr-scaling", c.lr_scaling, "none | linear (lr x data-parallel replicas: the world size under ddp)");
    auto& bucket_cap_mb = flags.add<double>("bucket-cap-mb", c.bucket_cap_mb, "ddp: gradient bucket size in MiB");
    auto& zero = flags.add<bool>("zero-redundancy-optimizer", false,
                                 "ddp: ZeRO-1, each rank keeps and steps the optimizer state of 1/N of the parameters");
    auto& sharding_strategy = flags.add<std::string>("sharding-strategy", c.sharding_strategy,
                                                     "fsdp: full_shard | shard_grad_op | no_shard | hybrid_shard");
    auto& reshard_after_forward = flags.add<std::string>(
        "reshard-after-forward", c.reshard_after_forward,
        "--dp-shard: default | always | never: free each unit's parameters after its forward (default: always, "
        "never under --pp, where a stage's units stay gathered through the step's micro-batches)");
    auto& fsdp_layout = flags.add<std::string>(
        "fsdp-layout", c.fsdp_layout,
        "--dp-shard: per_parameter (FSDP2's fully_shard: each parameter cut on dim 0, so --optimizer adamw keeps its "
        "weight-decay groups) | flat (FSDP1: each unit's parameters as one flat tensor, cut in equal ranges)");
    auto& shard_group_size = flags.add<int64_t>("shard-group-size", c.shard_group_size,
                                                "fsdp hybrid_shard: ranks per shard group (divides the world)");
    const ConvBenchmarkFlags conv_benchmark = add_conv_benchmark_flags(flags);
    flags.parse(argc, argv);
    apply_conv_benchmark_flags(conv_benchmark);

    if (!data.empty()) c.data = data;
    c.model = model;
    c.epochs = epochs;
    c.max_steps = max_steps;
    c.batch_size = batch_size;
    c.lr = lr;
    c.momentum = momentum;
    c.weight_decay = weight_decay;
    c.nesterov = nesterov;
    c.label_smoothing = smoothing;
    c.schedule = schedule;
    c.warmup_epochs = warmup_epochs;
    c.clip_grad_norm = clip_grad_norm;
    c.optimizer = optimizer;
    c.workers = workers;
    c.threads = threads;
    c.seed = static_cast<uint64_t>(seed);
    c.device = device;
    c.device_memory_limit = device_memory_limit;
    c.amp = amp;
    c.memory_format = memory_format;
    c.augment = !no_augment;
    c.shuffle = !no_shuffle;
    c.init = init;
    c.save = save;
    c.checkpoint_dir = checkpoint_dir;
    c.checkpoint_every = checkpoint_every;
    c.resume = resume;
    c.checkpoint_format = checkpoint_format;
    c.eval_only = eval_only;
    c.synthetic = synthetic;
    c.eval_limit = eval_limit;
    c.metrics_json = metrics_json;
    c.progress = !quiet;
    c.estimate_memory = estimate_memory;
    c.mode = mode;
    c.dp_devices = dp_devices;
    c.mp_devices = mp_devices;
    LOOM_CHECK(!flags.given("chunks") || !flags.given("microbatches") || chunks == microbatches, "--chunks ", chunks,
               " and --microbatches ", microbatches, " are one setting (micro-batches per batch) given twice; keep one");
    c.microbatches = flags.given("chunks") ? chunks : microbatches;
    c.pipeline_schedule = schedule_name;
    c.virtual_stages = virtual_stages;
    parse_balance(balance, c);
    c.pp = pp;
    c.dp_replicate = dp_replicate;
    c.dp_shard = dp_shard;
    c.tp = tp;
    c.pipeline_checkpoint = pipeline_checkpoint;
    c.activation_checkpoint = activation_checkpoint;
    c.selective_ac_option = selective_ac_option;
    c.backend = backend;
    c.sync_bn = sync_bn;
    c.lr_scaling = lr_scaling;
    c.bucket_cap_mb = bucket_cap_mb;
    c.zero_redundancy_optimizer = zero;
    c.sharding_strategy = sharding_strategy;
    c.reshard_after_forward = reshard_after_forward;
    c.fsdp_layout = fsdp_layout;
    c.shard_group_size = shard_group_size;
    LOOM_CHECK(!c.eval_only || !c.init.empty() || c.resume, "--eval-only needs --init PATH (or --resume)");
    train_cifar10(c);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "train_cifar10: error: %s\n", e.what());
    return 1;
  }
}
