#include "train/command_line.h"

#include <cstdio>
#include <sstream>

#include "core/error.h"            // defines: loom::Error, reported as one line
#include "data/data_root.h"        // defines: find_cifar10_root (--data)
#include "parallel/comm/launch_env.h"  // defines: read_launch_env (the world the degrees must fill)
#include "train/conv_benchmark.h"  // defines: --conv-benchmark (Note [Kernel autotuning])
#include "train/degrees.h"         // defines: needs_process_group, parallel_dims_from_flags
#include "train/flags.h"           // defines: Flags (--help is generated)
#include "train/recipe.h"          // defines: find_recipe, apply_recipe (--recipe), report_flag_error
#include "train/model_spec.h"      // defines: model_names (--model)
#include "train/path_flags.h"      // defines: check_output_folder, ... (Note [Path flags are checked first])

namespace loom::training {

namespace {

// --balance cost | time | 4,3,4,3: how to cut, or the layer counts themselves.
void parse_balance(const std::string& text, TrainConfig& c) {
  if (text == "cost" || text == "time") {
    c.parallel.balance_by = text;
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
    c.parallel.balance.push_back(value);
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
  explicit CommandLine(const TrainConfig& initial = {});
  TrainConfig c;
  std::string recipe, data = c.data.root.value_or(""), balance = c.parallel.balance_by;
  int64_t seed = static_cast<int64_t>(c.training.seed), chunks = c.parallel.microbatches;
  bool no_augment = !c.data.augment, no_shuffle = !c.data.shuffle, quiet = !c.metrics.progress;
  Flags flags;
  ConvBenchmarkFlags conv_benchmark;

  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;
};

// Note [One table, one place for each rule]
// Every rule about the flags' values sits in the table beside the flag it concerns: a value
// out of range or not among the choices (one_of, at_least), and the rules between flags
// (rule). Flags::check runs them all, on a command line's values as typed (parse_train_flags)
// and on a config however it was filled (check_train_config, which train_cifar10 calls,
// binds the table to a copy of it), before any data is read or model built: the code that uses the
// values would otherwise divide by --microbatches 0, read --max-steps -7 as "no limit",
// finish --epochs 0 successfully having done nothing, or learn of a misspelt
// --pipeline-checkpoint only after timing the model's layers. The path flags are checked
// there too (Note [Path flags are checked first], path_flags.h). What depends on the world
// (the degrees against WORLD_SIZE: degrees.cpp) or on the model (--balance's counts
// against its layers: parallelize.cpp) is checked where that is known.
CommandLine::CommandLine(const TrainConfig& initial)
    : c(initial),
      flags("train_cifar10",
            "Trains a model on CIFAR-10 (ResNet18, CIFAR variant, by default; other ResNets and "
            "ViTs with --model) in any parallel mode, as examples/reference/train_ddp.py does with PyTorch.") {
  flags.section("recipe");
  flags.bind("recipe", recipe, "recipes/NAME.toml or a .toml file: the flags' values as a TOML file; flags given "
             "beside it override its keys (docs/recipes.md)");

  flags.section("data");
  flags.bind("data", data, "CIFAR-10 binary folder (else $LOOM_DATA, else data/, else ../shared/data/)");
  flags.rule([this] {  // an explicit folder is checked now, not after the process group is up
    if (c.data.root && !c.data.root->empty() && !c.data.synthetic) data::find_cifar10_root(c.data.root);
  });
  flags.bind("synthetic", c.data.synthetic, "random CIFAR-shaped data (throughput without I/O)");
  flags.rule([this] {
    LOOM_CHECK(c.data.synthetic_size >= 1, "TrainConfig::data.synthetic_size: expected at least 1, got ",
               c.data.synthetic_size);
  });
  flags.bind("batch-size", c.data.batch_size, "images per step (per process)");
  flags.at_least(1, "at least 1");
  flags.bind("workers", c.data.workers, "DataLoader worker threads");
  flags.at_least(0, "0 (load in the training thread) or more");
  flags.bind("no-augment", no_augment, "no random crop/flip");
  flags.bind("crop-padding", c.data.crop_padding,
             "RandomCrop(32, padding=N) of the training images: a shift of up to N pixels each way (0: none)");
  flags.at_least(0, "0 (no crop) or more pixels");
  flags.bind("padding-mode", c.data.padding_mode,
             "the crop's border: constant (zeros, torchvision's default) | reflect (the image mirrored at its edge)");
  flags.one_of({"constant", "reflect"});
  flags.bind("flip", c.data.flip,
             "random (RandomHorizontalFlip) | alternating (a coin per image drawn once, inverted every other epoch: "
             "each image shown both ways in any two epochs, as airbench) | none");
  flags.one_of({"random", "alternating", "none"});
  flags.bind("no-shuffle", no_shuffle, "sequential training order");
  flags.bind("eval-limit", c.data.eval_limit, "evaluate on at most N test images (-1: all)");
  flags.at_least(-1, "-1 (the whole test set) or 0 or more");
  flags.bind("tta", c.training.tta,
             "test-time augmentation of every evaluation: none | mirror (2 views) | mirror_translate (6 views, "
             "the speedruns')");
  flags.one_of({"none", "mirror", "mirror_translate"});

  flags.section("model");
  flags.bind("model", c.model.name, joined_model_names() + " (ResNets with the CIFAR stem)");
  flags.bind("init", c.model.init, "load weights (safetensors) before training");
  flags.rule([this] { check_input_file("--init", c.model.init); });
  flags.bind("seed", seed, "seed for init, shuffling, augmentation");
  flags.at_least(0, "0 or more");

  flags.section("optimizer and schedule", "optimizer");
  flags.bind("epochs", c.training.epochs, "passes over the training set");
  flags.rule([this] {
    LOOM_CHECK(c.training.epochs >= 1 || c.training.eval_only,
               "--epochs: expected at least 1 (--eval-only evaluates without training), got ", c.training.epochs);
  });
  flags.bind("max-steps", c.training.max_steps, "stop after this many optimizer steps (-1: no limit)");
  flags.at_least(-1, "-1 (no limit) or 0 or more (0: --save the initial weights)");
  flags.bind("optimizer", c.optim.name,
             "sgd | adamw (AdamW: --weight-decay decoupled, none on biases, norms and embeddings)");
  flags.one_of({"sgd", "adamw"});
  flags.bind("lr", c.optim.lr, "learning rate");
  flags.at_least(0, "0 or more");
  flags.bind("momentum", c.optim.momentum, "SGD momentum");
  flags.in_range(0, 1, "0 to 1");
  flags.bind("weight-decay", c.optim.weight_decay, "L2 penalty (AdamW: decoupled decay)");
  flags.at_least(0, "0 or more");
  flags.bind("no-decay-norms-and-biases", c.optim.no_decay_norms_and_biases,
             "sgd: no weight decay on biases and BatchNorm/LayerNorm parameters (adamw never decays them)");
  flags.bind("nesterov", c.optim.nesterov, "Nesterov momentum");
  flags.bind("label-smoothing", c.optim.label_smoothing, "cross-entropy label smoothing");
  flags.in_range(0, 1, "0 to 1 (the share of the target spread over every class)");
  flags.bind("schedule", c.optim.schedule,
             "LR schedule: none | cosine | onecycle | warmup_cosine (linear warm-up, then cosine)");
  flags.one_of({"none", "cosine", "onecycle", "warmup_cosine"});
  flags.bind("warmup-epochs", c.optim.warmup_epochs, "warmup_cosine: epochs of warm-up");
  flags.at_least(0, "0 or more");
  flags.bind("clip-grad-norm", c.optim.clip_grad_norm,
             "clip the gradients' 2-norm (over the whole model, however it is cut) to this before each step; 0: no");
  flags.at_least(0, "0 (no clipping) or a positive norm");
  flags.bind("lookahead-every", c.optim.lookahead_every,
             "Lookahead every N steps: an average of the weights and BatchNorm statistics (decay "
             "--lookahead-decay^N x progress^3) that the model is pulled back to; taken whole at the end (0: off)");
  flags.at_least(0, "0 (off) or a number of steps");
  flags.bind("lookahead-decay", c.optim.lookahead_decay, "Lookahead: the average's decay per step, in [0, 1]");
  flags.in_range(0, 1, "a decay in [0, 1]");
  flags.bind("lr-scaling", c.optim.lr_scaling, "none | linear (lr x data-parallel replicas: the world size under ddp)");
  flags.one_of({"none", "linear"});

  flags.section("device and precision", "training");
  flags.bind("device", c.training.device, "cpu | cpu:N | cuda | cuda:N");
  flags.bind("threads", c.training.threads, "compute threads (0: OpenMP's default)");
  flags.at_least(0, "0 (OpenMP's default) or more");
  flags.bind("device-memory-limit", c.training.device_memory_limit,
             "cap on each training device's reserved memory, e.g. 1.5GiB (per rank; OutOfMemoryError past it)");
  flags.bind("amp", c.training.amp, "mixed precision: none | bf16 | fp16 (autocast; fp16 adds a GradScaler)");
  flags.one_of({"none", "bf16", "fp16"});
  flags.bind("memory-format", c.training.memory_format,
             "auto | contiguous | channels_last: the images' layout (auto: channels_last on the CPU under --amp bf16, "
             "and in float32 without AVX-512)");
  flags.one_of({"auto", "contiguous", "channels_last"});
  flags.bind("activation-checkpoint", c.model.activation_checkpoint,
             "none | full | selective: keep only each residual block's (encoder layer's) input and recompute its "
             "activations in backward, for every block or every --selective-ac-option-th (docs/memory.md)");
  flags.one_of({"none", "full", "selective"});
  flags.bind("selective-ac-option", c.model.selective_ac_option,
             "--activation-checkpoint selective: checkpoint every N-th block");
  flags.at_least(1, "N >= 1 (checkpoint every N-th block)");
  flags.bind("estimate-memory", c.training.estimate_memory,
             "print each rank's predicted peak memory for these flags (shape-only steps: allocations without "
             "arithmetic) and exit without training (docs/memory.md)");
  flags.rule([this] {
    LOOM_CHECK(!c.training.estimate_memory || (!c.checkpoint.resume && !c.training.eval_only),
               "--estimate-memory predicts the memory of training steps from a fresh start; drop --resume and --eval-only");
  });
  conv_benchmark = add_conv_benchmark_flags(flags);
  flags.rule([this] {
    LOOM_CHECK(!*conv_benchmark.deterministic || balance != "time",  // --balance as typed
               "--deterministic refuses --balance time: a cut by measured layer times can differ run to run. Use "
               "--balance cost (counted, the same every run) or give the layer counts");
  });

  flags.section("checkpoints and metrics", "checkpoint");
  flags.bind("save", c.checkpoint.save, "write final weights (safetensors)");
  flags.rule([this] { check_output_file("--save", c.checkpoint.save); });
  flags.bind("checkpoint-dir", c.checkpoint.dir, "write full training state here");
  flags.rule([this] { check_output_folder("--checkpoint-dir", c.checkpoint.dir); });
  flags.bind("checkpoint-every", c.checkpoint.every,
             "steps between checkpoints (also at each epoch end; 0: only then)");
  flags.at_least(0, "0 (only at epoch ends) or more");
  flags.bind("resume", c.checkpoint.resume, "continue from --checkpoint-dir exactly");
  flags.bind("checkpoint-format", c.checkpoint.format,
             "full (FULL_STATE_DICT: one file gathered on rank 0, loads at any world size) | sharded (a file per rank "
             "+ a manifest, each piece with its place in the whole tensor: resumes under any other world size and "
             "layout, as torch.distributed.checkpoint) (default: sharded under --dp-shard, --pp, --tp or "
             "--zero-redundancy-optimizer, else full)");
  flags.rule([this] {
    const std::string& format = c.checkpoint.format;
    LOOM_CHECK(format.empty() || format == "full" || format == "sharded", "--checkpoint-format: expected full "
               "(FULL_STATE_DICT: one file gathered on rank 0) or sharded (SHARDED_STATE_DICT: a file per rank and a "
               "manifest), got '", format, "'");
  });
  flags.bind("eval-only", c.training.eval_only, "evaluate --init on the test set and exit");
  flags.bind("metrics-json", c.metrics.json, "write final metrics as JSON");
  flags.rule([this] { check_output_file("--metrics-json", c.metrics.json); });
  flags.bind("quiet", quiet, "no progress bar");

  flags.section("parallelism: degrees across processes (under loomrun)", "parallel");
  flags.bind("pp", c.parallel.pp, "degree: pipeline stages as processes, one per rank, under loomrun");
  flags.at_least(1, "at least 1 pipeline stage");
  flags.bind("dp-replicate", c.parallel.dp_replicate,
             "degree: replicas of the model or of each stage (DistributedDataParallel; 0: --mode's preset)");
  flags.at_least(0, "0 (--mode's preset) or more");
  flags.bind("dp-shard", c.parallel.dp_shard,
             "degree: shards of the model (FullyShardedDataParallel; -1: what the world leaves; 0: --mode's preset)");
  flags.at_least(-1, "-1 (what the world leaves), 0 (--mode's preset) or more");
  flags.bind("tp", c.parallel.tp,
             "degree: tensor-parallel ranks, each block's layers split over them (docs/tensor_parallel.md)");
  flags.at_least(1, "at least 1 tensor-parallel rank");
  flags.bind("mode", c.parallel.mode,
             "single | dp (DataParallel: one process, several devices) | mp (layer-wise model parallel) | pipeline "
             "(micro-batches over the mp stages) | ddp (DistributedDataParallel; start with loomrun) | fsdp "
             "(FullyShardedDataParallel; start with loomrun)");
  flags.one_of({"single", "dp", "mp", "pipeline", "ddp", "fsdp"});
  flags.rule([this] {
    const ParallelConfig& p = c.parallel;
    LOOM_CHECK(p.pp == 1 || p.mode == "pipeline" || p.mode == "ddp" || p.mode == "single", "--pp ", p.pp,
               " runs the stages of a pipeline as processes: alone, with --mode pipeline or ddp, or with "
               "--dp-replicate; got --mode ", p.mode);
  });
  flags.bind("backend", c.parallel.backend, "ddp: gloo | nccl (default: nccl on cuda, gloo on cpu)");
  flags.rule([this] {
    const std::string& backend = c.parallel.backend;
    LOOM_CHECK(backend.empty() || backend == "gloo" || backend == "nccl", "--backend: expected gloo or nccl (or "
               "nothing: nccl on cuda, gloo on cpu), got '", backend, "'");
  });
  flags.bind("comm-timeout", c.parallel.comm_timeout_s,
             "seconds the rendezvous and each collective wait for the other ranks before failing with an error "
             "naming them (init_process_group's timeout)");
  flags.rule([this] {
    LOOM_CHECK(c.parallel.comm_timeout_s > 0 && c.parallel.comm_timeout_s <= 86400, "--comm-timeout: expected "
               "seconds in (0, 86400], got ", c.parallel.comm_timeout_s);
  });
  flags.bind("sync-bn", c.parallel.sync_bn, "ddp: BatchNorm statistics over every rank (SyncBatchNorm)");
  flags.bind("bucket-cap-mb", c.parallel.bucket_cap_mb, "ddp: gradient bucket size in MiB");
  flags.above(0, "a positive size in MiB");
  flags.bind("zero-redundancy-optimizer", c.parallel.zero_redundancy_optimizer,
             "ddp: ZeRO-1, each rank keeps and steps the optimizer state of 1/N of the parameters");
  flags.rule([this] {
    const ParallelConfig& p = c.parallel;
    LOOM_CHECK(!p.zero_redundancy_optimizer || p.mode == "ddp" || p.dp_replicate > 1,
               "--zero-redundancy-optimizer shards the optimizer state over DDP's ranks: it needs --mode ddp or "
               "--dp-replicate, got --mode ", p.mode);
  });
  flags.bind("sharding-strategy", c.parallel.sharding_strategy,
             "fsdp: full_shard | shard_grad_op | no_shard | hybrid_shard");
  flags.bind("shard-group-size", c.parallel.shard_group_size,
             "fsdp hybrid_shard: ranks per shard group (divides the world)");
  flags.at_least(0, "0 (no hybrid_shard) or more");
  flags.bind("reshard-after-forward", c.parallel.reshard_after_forward,
             "--dp-shard: default | always | never: free each unit's parameters after its forward (default: always, "
             "never under --pp, where a stage's units stay gathered through the step's micro-batches)");
  flags.one_of({"default", "always", "never"});
  flags.bind("fsdp-layout", c.parallel.fsdp_layout,
             "--dp-shard: per_parameter (FSDP2's fully_shard: each parameter cut on dim 0, so --optimizer adamw keeps "
             "its weight-decay groups) | flat (FSDP1: each unit's parameters as one flat tensor, cut in equal ranges)");
  flags.one_of({"flat", "per_parameter"});

  flags.section("parallelism: pipelines (--pp, --mode pipeline) and devices in one process", "parallel");
  flags.bind("microbatches", c.parallel.microbatches,
             "pipeline: micro-batches per batch (PyTorch pipelining's n_microbatches)");
  flags.at_least(1, "at least 1 micro-batch per batch");
  flags.bind("chunks", chunks, "pipeline: --microbatches by torchgpipe's name");
  flags.at_least(1, "at least 1 micro-batch per batch");
  flags.bind("pipeline-schedule", c.parallel.pipeline_schedule, "pipeline: gpipe | 1f1b | interleaved_1f1b");
  flags.one_of({"gpipe", "1f1b", "interleaved_1f1b"});
  flags.bind("virtual-stages", c.parallel.virtual_stages, "pipeline, interleaved_1f1b: model chunks per stage (V)");
  flags.at_least(1, "at least 1 virtual stage per stage");
  flags.rule([this] {
    const ParallelConfig& p = c.parallel;
    LOOM_CHECK(p.virtual_stages == 1 || p.pipeline_schedule == "interleaved_1f1b", "--virtual-stages ",
               p.virtual_stages, " needs --pipeline-schedule interleaved_1f1b, got ", p.pipeline_schedule);
  });
  flags.bind("balance", balance,
             "pipeline: where to cut the model: cost (counted FLOPs and bytes: the same every run), time (measured "
             "once, on rank 0), or layers per virtual stage a,b,... (stages x V entries adding up to the model's "
             "Sequential: 14 for resnet18)");
  flags.rule([this] {
    const ParallelConfig& p = c.parallel;
    LOOM_CHECK(p.balance_by == "cost" || p.balance_by == "time",
               "--balance: expected cost, time or comma-separated layer counts such as 7,7, got '", p.balance_by, "'");
    LOOM_CHECK((p.balance.empty() && p.balance_by == "cost") || p.mode == "pipeline" || p.mode == "mp" || p.pp > 1,
               "--balance cuts the model into stages: it needs --mode mp or pipeline, or --pp, got --mode ", p.mode);
  });
  flags.bind("pipeline-checkpoint", c.parallel.pipeline_checkpoint,
             "pipeline: never | except_last | always (recompute each micro-batch's activations in its backward: less "
             "memory)");
  flags.one_of({"never", "except_last", "always"});
  flags.rule([this] {
    const ParallelConfig& p = c.parallel;
    LOOM_CHECK(p.pipeline_checkpoint == "never" || p.mode == "pipeline" || p.pp > 1, "--pipeline-checkpoint ",
               p.pipeline_checkpoint, " recomputes a pipeline's micro-batches: it needs --mode pipeline or --pp, got --mode ",
               p.mode);
  });
  flags.bind("mp-devices", c.parallel.mp_devices, "mp, pipeline: stages, one device each");
  flags.at_least(1, "at least 1 stage");
  flags.bind("dp-devices", c.parallel.dp_devices,
             "dp: devices (0: every GPU with --device cuda, 2 on cpu: cpu:0 and cpu:1)");
  flags.at_least(0, "0 (the default devices) or more");
}

}  // namespace

TrainConfig parse_train_flags(int argc, char** argv) {
  CommandLine line;
  TrainConfig& c = line.c;
  // Note [Recipes are defaults] (train/recipe.h): the recipe first, the command line over it.
  if (const std::string recipe = recipe_argument(argc, argv); !recipe.empty()) {
    c.recipe = find_recipe(recipe);
    apply_recipe(line.flags, c.recipe);
  }
  line.flags.parse(argc, argv);
  line.flags.check();  // as typed, before the values below are folded in: each error names the flag given
  apply_conv_benchmark_flags(line.conv_benchmark);

  if (!line.data.empty()) c.data.root = line.data;
  c.training.seed = static_cast<uint64_t>(line.seed);
  c.data.augment = !line.no_augment;
  c.data.shuffle = !line.no_shuffle;
  c.metrics.progress = !line.quiet;
  LOOM_CHECK(!line.flags.given("chunks") || !line.flags.given("microbatches") || line.chunks == c.parallel.microbatches,
             "--chunks ", line.chunks, " and --microbatches ", c.parallel.microbatches,
             " are one setting (micro-batches per batch) given twice; keep one");
  if (line.flags.given("chunks")) c.parallel.microbatches = line.chunks;
  parse_balance(line.balance, c);
  c.effective_toml = line.flags.to_toml({"recipe"});
  // A command line's rule only: a program may evaluate a model's initial weights on purpose
  // (TrainConfig::training.eval_only without an init), a user who types --eval-only rarely.
  LOOM_CHECK(!c.training.eval_only || !c.model.init.empty() || c.checkpoint.resume,
             "--eval-only needs --init PATH (or --resume)");
  return c;  // the table's rules: train_cifar10 runs them (check_train_config)
}

void check_train_config(const TrainConfig& config) {
  CommandLine table(config);
  table.flags.check();
}

std::string effective_config_toml(const TrainConfig& config) {
  if (!config.effective_toml.empty()) return config.effective_toml;
  CommandLine table(config);  // a config filled in code: its fields, as the flags would set them
  return table.flags.to_toml({"recipe"});
}

int train_main(int argc, char** argv) {
  TrainConfig config;
  try {
    config = parse_train_flags(argc, argv);
    check_train_config(config);
    const distributed::LaunchEnv launch = distributed::read_launch_env(distributed::process_environment());
    if (needs_process_group(config) && launch.world_size > 0)  // the degrees against the launch's world
      parallel_dims_from_flags(config, launch.world_size);
  } catch (const std::exception& e) {  // the same in every process of a launch: said once
    return report_flag_error("train_cifar10", e);
  }
  try {
    train_cifar10(config);
    return 0;
  } catch (const std::exception& e) {  // a filesystem_error or bad_alloc too: one line, never an abort
    std::fprintf(stderr, "train_cifar10: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace loom::training
