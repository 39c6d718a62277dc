#include "train/checkpointer.h"

#include <cstdio>
#include <map>
#include <vector>

#include "core/error.h"                         // defines: LOOM_CHECK
#include "train/model_spec.h"          // defines: model_spec (one process's optimizer numbering)
#include "train/optimizer.h"           // defines: BuiltOptimizer (ZeRO-1's partition), build_optimizer
#include "train/sharded_checkpoint.h"  // defines: save_sharded_checkpoint, load_sharded_checkpoint, ...
#include "nn/safetensors.h"                     // defines: safetensors::save_file

namespace loom::training {

namespace {

// Note [Lookahead in a checkpoint]
// Lookahead's average is training state as the optimizer's momentum is: a run resumed
// without it would pull the model back to the wrong point at the next update. It is kept
// in the full checkpoint's model section under "lookahead." + the model's names (no model
// has a top-level module of that name), and taken out again before the model loads its
// own entries. Lookahead runs only where every rank holds the whole model (Trainer's
// make_lookahead), so the full format always fits it.
constexpr const char* kLookaheadPrefix = "lookahead.";

// The model's own entries of a saved model section, and Lookahead's.
std::pair<OrderedDict<Tensor>, OrderedDict<Tensor>> split_lookahead(const OrderedDict<Tensor>& saved) {
  OrderedDict<Tensor> model;
  for (const auto& [name, tensor] : saved)
    if (name.rfind(kLookaheadPrefix, 0) != 0) model.insert(name, tensor);
  return {model, take_prefixed(saved, kLookaheadPrefix)};
}

}  // namespace

Checkpointer::Checkpointer(const TrainConfig& config, const Distributed& dist, ParallelModel& parallel,
                           const BuiltOptimizer& optimizer, optim::LRScheduler* scheduler, optim::GradScaler* scaler,
                           optim::Lookahead* lookahead)
    : config_(config),
      dist_(dist),
      parallel_(parallel),
      built_(optimizer),
      scheduler_(scheduler),
      scaler_(scaler),
      lookahead_(lookahead) {
  const auto& dims = dist.dims();
  // Whether the ranks hold different state: then each writes its own.
  const bool sharded_state =
      dims.dp_shard_enabled() || dims.pp_enabled() || dims.tp_enabled() || optimizer.zero_redundancy != nullptr;
  const std::string& format = config.checkpoint.format;
  // Sharded checkpoints hold pieces of the plain model's tensors (Note [Sharded checkpoints in
  // train_cifar10]): any run across processes, or in one process on one device, can write one
  // that any other layout resumes from. Not the in-process multi-device modes, whose replicas
  // and stages live on devices of one process.
  LOOM_CHECK(format != "sharded" || (!dims.dp_devices_enabled() && !dims.mp_enabled()), "--checkpoint-format "
             "sharded: ", dims.str(), " keeps its replicas or stages on devices of one process; use full");
  LOOM_CHECK(format != "full" || !dims.tp_enabled(), "--checkpoint-format full with --tp ", dims.tp, ": each "
             "tensor-parallel rank's optimizer state is for its own shards and is never gathered onto one; use "
             "sharded (the default under --tp; --save writes the whole model's weights)");
  LOOM_CHECK(format != "full" || !dims.pp_enabled(), "--checkpoint-format full with --pp ", dims.pp, ": each "
             "stage's optimizer state lives on its own ranks and is never gathered onto one; use sharded (the "
             "default under --pp)");
  sharded_ = format.empty() ? sharded_state : format == "sharded";
  LOOM_CHECK(!lookahead_ || !sharded_ || config.checkpoint.dir.empty(), "--lookahead-every with --checkpoint-format "
             "sharded: Lookahead's average is saved in the full format only; use --checkpoint-format full");
}

namespace {

// The model's parameter names in the numbering one process's optimizer gives them (Note
// [Flat optimizer state], nn/optim/optimizer.h), which a full checkpoint's optimizer state
// uses: the optimizer build_optimizer makes over a freshly built model of these flags.
std::vector<std::string> one_process_numbering(const TrainConfig& config) {
  TrainConfig one = config;
  one.parallel.zero_redundancy_optimizer = false;  // ZeRO-1 gathers into a plain optimizer's numbering
  const std::shared_ptr<nn::Module> model = model_spec(config.model.name).build(config.model.name, 10);
  const BuiltOptimizer optimizer =
      build_optimizer(model->parameters(), *model, own_parameters(*model), nullptr, one, config.optim.lr);
  std::map<const TensorImpl*, std::string> names;
  for (const auto& [name, p] : model->named_parameters()) names.emplace(p.unsafe_impl(), name);
  std::vector<std::string> numbered;
  for (const optim::ParamGroup& group : (*optimizer).param_groups())
    for (const Tensor& p : group.params) numbered.push_back(names.at(p.unsafe_impl()));
  return numbered;
}

}  // namespace

TrainingPosition Checkpointer::resume() {
  const std::string& dir = config_.checkpoint.dir;
  LOOM_CHECK(!config_.checkpoint.resume || !dir.empty(), "--resume needs --checkpoint-dir DIR");
  // Skipped checkpoints, which one was chosen and where a run resumed are said even under
  // --quiet: a run that silently continued from another step than expected would be hard
  // to explain.
  const CheckpointToResume from = checkpoint_to_resume(dir, config_.checkpoint.resume, sharded_, dist_.is_main());
  const bool resuming = !from.path.empty();
  LOOM_CHECK(dist_.sum(resuming ? 1.0 : 0.0) == (resuming ? dist_.world_size() : 0), "--checkpoint-dir ", dir,
             ": some ranks found a checkpoint to resume from and others did not; on several nodes the directory "
             "must be shared by every rank");
  if (!resuming) {
    if (!dir.empty() && dist_.is_main()) {
      // Said even under --quiet, as the resume's lines: a removal is not to go unnoticed.
      const int removed = clear_checkpoints(dir);
      if (removed > 0)
        std::fprintf(stderr, "%s: removed %d checkpoint%s of an earlier run (a first start trains from scratch; "
                     "--resume continues one)\n", dir.c_str(), removed, removed == 1 ? "" : "s");
    }
    return {};
  }
  // Whichever format wrote it (Note [Resuming either format], checkpoint.h).
  const auto& dims = dist_.dims();
  TrainingPosition at;
  LOOM_CHECK(!lookahead_ || !from.sharded, "--resume: ", from.path, " is a sharded checkpoint, which holds no "
             "Lookahead average (Note [Lookahead in a checkpoint]); this run's --lookahead-every cannot continue from it");
  if (from.sharded) {
    LOOM_CHECK(!dims.dp_devices_enabled() && !dims.mp_enabled(), "--resume: ", from.path, " is a sharded "
               "checkpoint, and ", dims.str(), " keeps its replicas or stages on devices of one process, which "
               "cannot read one; resume it in one process, across processes (loomrun), or start from its weights "
               "(dcp_convert to-file, then --init)");
    at = load_sharded_checkpoint(from.path, dist_, parallel_, built_, scheduler_, scaler_);
  } else if (dims.pp_enabled() || dims.tp_enabled()) {  // ranks hold pieces: read the file as a one-file set
    const std::vector<std::string> numbered = one_process_numbering(config_);  // before the generator is restored
    at = load_full_checkpoint_as_pieces(from.path, parallel_, built_, numbered, scheduler_, scaler_);
  } else {  // every rank reads the whole state; each part takes its own (FSDP: its shards)
    CheckpointState state = read_checkpoint(dir, scheduler_, scaler_);
    auto [model_state, averaged] = split_lookahead(state.model);  // Note [Lookahead in a checkpoint]
    LOOM_CHECK(lookahead_ || averaged.empty(), from.path, " was written with --lookahead-every (it holds Lookahead's "
               "average); resume it with the same --lookahead-every");
    LOOM_CHECK(!lookahead_ || !averaged.empty(), from.path, " holds no Lookahead average: it was written without "
               "--lookahead-every, so this run cannot continue its Lookahead exactly; resume without the flag");
    if (lookahead_) lookahead_->load_state_dict(averaged);
    parallel_.load_full_state_dict(model_state);
    parallel_.load_full_optim_state_dict(built_, state.optimizer);
    at = state.position;
  }
  // Every rank must have picked the same step (a checkpoint written meanwhile could differ).
  LOOM_CHECK(dist_.sum(static_cast<double>(at.global_step)) == dist_.world_size() * at.global_step,
             "--checkpoint-dir ", dir, ": the ranks resumed from different checkpoints; on several nodes the "
             "directory must be shared by every rank");
  // A checkpoint's epoch metrics are every rank's sum; one rank carries them on.
  if (!dist_.is_main()) at.metrics = RunningMetrics{};
  if (dist_.is_main())
    std::fprintf(stderr, "resumed from %s (a %s checkpoint) at epoch %lld, step %lld\n", from.path.c_str(),
                 from.sharded ? "sharded" : "full", static_cast<long long>(at.epoch + 1),
                 static_cast<long long>(at.global_step));
  return at;
}

void Checkpointer::save(const TrainingPosition& at) {
  if (config_.checkpoint.dir.empty()) return;
  const std::string& dir = config_.checkpoint.dir;
  if (sharded_) {
    save_sharded_checkpoint(dir, dist_, parallel_, built_, scheduler_, at, scaler_);
  } else {  // gathered (FSDP's shards, ZeRO-1's partitions): every rank takes part, rank 0 writes
    OrderedDict<Tensor> model_state = parallel_.full_state_dict();
    if (lookahead_) add_prefixed(model_state, kLookaheadPrefix, lookahead_->state_dict());
    OrderedDict<Tensor> optimizer_state = parallel_.full_optim_state_dict(built_, dist_.is_main());
    if (dist_.is_main()) save_checkpoint(dir, model_state, optimizer_state, scheduler_, at, scaler_);
  }
  dist_.barrier();
}

void Checkpointer::save_weights(const std::string& path) {
  if (path.empty()) return;
  // Rank 0 writes the file: the model's own keys and shapes, as a single process saves
  // them (without DDP's "module."), whatever cut the ranks hold.
  const OrderedDict<Tensor> state = parallel_.full_state_dict();
  if (dist_.is_main()) {
    safetensors::save_file(state, path, {{"format", "pt"}});  // as nn::save writes a module
    std::printf("saved weights to %s\n", path.c_str());
  }
}

}  // namespace loom::training
