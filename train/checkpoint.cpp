#include "train/checkpoint.h"

#include <cstdio>  // defines: std::fprintf, the line naming skipped checkpoints
#include <filesystem>

#include "core/error.h"
#include "core/generator.h"
#include "nn/safetensors.h"
#include "parallel/comm/launch_env.h"  // defines: read_launch_env (the restart count)
#include "parallel/distributed_checkpoint.h"  // defines: find_latest_complete, remove_all_checkpoints (sharded sets)

namespace loom::training {
namespace {

const std::string& metadata_text(const safetensors::Metadata& metadata, const std::string& key,
                                 const std::string& path) {
  const std::string* value = metadata.find(key);
  LOOM_CHECK(value, "checkpoint ", path, " has no '", key, "' in its metadata: it was not written by train_cifar10");
  return *value;
}

// The global step a full checkpoint file was saved at, from its header alone.
int64_t saved_step(const std::string& path) {
  return std::stoll(metadata_text(safetensors::read_metadata(path), "global_step", path));
}

std::string exact(double value) {  // round-trips a double through text
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

}  // namespace

std::string checkpoint_path(const std::string& dir) { return dir + "/checkpoint.safetensors"; }

// See Note [Resuming either format].
CheckpointToResume checkpoint_to_resume(const std::string& dir, bool resume, bool prefer_sharded, bool log) {
  if (dir.empty()) return {};
  const int restart = distributed::read_launch_env(distributed::process_environment()).restart_count;
  if (!resume && restart == 0) return {};  // a first start: Note [Resuming after a restart]
  // Only the renamed file counts; a *.tmp.<pid> left by a rank killed mid-save does not.
  const std::string file = checkpoint_path(dir);
  CheckpointToResume full;
  if (std::filesystem::is_regular_file(file)) full = {file, false, saved_step(file)};
  // Note [The manifest is written last] (parallel/distributed_checkpoint.h).
  const distributed::checkpoint::Latest latest = distributed::checkpoint::find_latest_complete(dir);
  if (log && !latest.skipped.empty())
    std::fprintf(stderr, "%s: skipped incomplete sharded checkpoints: %s\n", dir.c_str(),
                 distributed::checkpoint::describe_skipped(latest).c_str());
  CheckpointToResume sharded;
  if (!latest.step_dir.empty()) sharded = {latest.step_dir, true, latest.global_step};
  LOOM_CHECK(!resume || !full.path.empty() || !sharded.path.empty(), "--resume: no checkpoint in ", dir,
             ": neither a full one (", file, ") nor a complete sharded one (", dir, "/step-*: ",
             latest.skipped.empty() ? std::string("none")
                                    : "only incomplete ones: " + distributed::checkpoint::describe_skipped(latest),
             "). Run once with --checkpoint-dir ", dir, " to create one");
  if (full.path.empty()) return sharded;
  if (sharded.path.empty()) return full;
  const bool take_sharded =
      sharded.global_step > full.global_step || (sharded.global_step == full.global_step && prefer_sharded);
  if (log)
    std::fprintf(stderr, "%s holds a full checkpoint at step %lld and a sharded one at step %lld: resuming from the "
                 "%s one (%s)\n", dir.c_str(), static_cast<long long>(full.global_step),
                 static_cast<long long>(sharded.global_step), take_sharded ? "sharded" : "full",
                 sharded.global_step != full.global_step ? "the later step"
                                                         : "the same step; the format this run writes");
  return take_sharded ? sharded : full;
}

int clear_checkpoints(const std::string& dir) {
  int removed = distributed::checkpoint::remove_all_checkpoints(dir);
  std::error_code error;
  if (std::filesystem::remove(checkpoint_path(dir), error)) ++removed;
  return removed;
}

safetensors::File pack_training_state(const OrderedDict<Tensor>& model_state, const OrderedDict<Tensor>& optimizer_state,
                                      const optim::LRScheduler* scheduler, const TrainingPosition& position,
                                      const optim::GradScaler* scaler) {
  safetensors::File file;
  OrderedDict<Tensor>& tensors = file.tensors;
  add_prefixed(tensors, "model.", model_state);
  add_prefixed(tensors, "optimizer.", optimizer_state);
  if (scheduler) add_prefixed(tensors, "scheduler.", scheduler->state_dict());
  if (scaler) add_prefixed(tensors, "scaler.", scaler->state_dict());  // empty when disabled
  Generator& gen = default_generator();
  safetensors::Metadata& metadata = file.metadata;
  metadata.insert("format", "loom-train-checkpoint");
  metadata.insert("epoch", std::to_string(position.epoch));
  metadata.insert("step_in_epoch", std::to_string(position.step_in_epoch));
  metadata.insert("global_step", std::to_string(position.global_step));
  metadata.insert("generator_seed", std::to_string(gen.seed()));
  metadata.insert("generator_offset", std::to_string(gen.offset()));
  metadata.insert("metrics_loss_sum", exact(position.metrics.loss_sum));
  metadata.insert("metrics_correct", exact(position.metrics.correct));
  metadata.insert("metrics_examples", exact(position.metrics.examples));
  return file;
}

void save_checkpoint(const std::string& dir, const OrderedDict<Tensor>& model_state,
                     const OrderedDict<Tensor>& optimizer_state, const optim::LRScheduler* scheduler,
                     const TrainingPosition& position, const optim::GradScaler* scaler) {
  std::filesystem::create_directories(dir);
  safetensors::File file = pack_training_state(model_state, optimizer_state, scheduler, position, scaler);
  safetensors::save_file(file.tensors, checkpoint_path(dir), file.metadata);  // atomic
}

CheckpointState read_checkpoint(const std::string& dir, optim::LRScheduler* scheduler, optim::GradScaler* scaler) {
  const std::string path = checkpoint_path(dir);
  LOOM_CHECK(std::filesystem::is_regular_file(path), "--resume: no checkpoint at ", path,
             "; run once with --checkpoint-dir ", dir, " to create it");
  return unpack_training_state(safetensors::read_file(path), path, scheduler, scaler);
}

CheckpointState unpack_training_state(const safetensors::File& file, const std::string& path,
                                      optim::LRScheduler* scheduler, optim::GradScaler* scaler) {
  CheckpointState state;
  state.model = take_prefixed(file.tensors, "model.");
  state.optimizer = take_prefixed(file.tensors, "optimizer.");
  state.metadata = file.metadata;
  if (scheduler) scheduler->load_state_dict(take_prefixed(file.tensors, "scheduler."));
  if (scaler && scaler->is_enabled()) {
    OrderedDict<Tensor> scaler_state = take_prefixed(file.tensors, "scaler.");
    if (!scaler_state.empty()) scaler->load_state_dict(scaler_state);  // else: saved without --amp fp16
  }
  auto text = [&](const char* key) { return metadata_text(file.metadata, key, path); };
  default_generator().set_state(std::stoull(text("generator_seed")), std::stoull(text("generator_offset")));
  TrainingPosition& position = state.position;
  position.epoch = std::stoll(text("epoch"));
  position.step_in_epoch = std::stoll(text("step_in_epoch"));
  position.global_step = std::stoll(text("global_step"));
  position.metrics.loss_sum = std::stod(text("metrics_loss_sum"));
  position.metrics.correct = std::stod(text("metrics_correct"));
  position.metrics.examples = std::stod(text("metrics_examples"));
  return state;
}

}  // namespace loom::training
