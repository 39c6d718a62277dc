// train_cifar10 (train/trainer.h): resume equivalence -- training 2k steps equals
// k steps + checkpoint + resume + k steps, bit for bit (Note [What a checkpoint holds] in
// train/checkpoint.h) -- and the errors of a config it cannot run.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "autograd/ops.h"  // defines: argmax, eq, sum
#include "nn/loss.h"
#include "nn/test_time_augmentation.h"
#include "train/checkpoint.h"
#include "train/loaders.h"     // defines: make_dataset
#include "train/model_spec.h"  // defines: model_spec
#include "train/trainer.h"
#include "nn/safetensors.h"
#include "saved_weights.h"  // defines: check_same_weights

using namespace loom;
using namespace loom::training;
using loom::testing::check_same_weights;
using loom::testing::max_weight_difference;

namespace {

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("loom_resume_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

TrainConfig small_run() {
  TrainConfig c;
  c.model.name = "tiny";
  c.data.synthetic = true;
  c.data.synthetic_size = 320;  // 10 steps of 32 per epoch
  c.data.batch_size = 32;
  c.training.epochs = 3;
  c.optim.lr = 0.05;
  c.optim.schedule = "cosine";  // the scheduler's position must survive the resume too
  c.data.workers = 1;
  c.data.eval_limit = 64;
  c.metrics.progress = false;
  c.training.seed = 3;
  return c;
}

// Trains `straight` again, stopping after `stop` steps with a checkpoint, then resumes to
// straight.training.max_steps; the final weights must equal straight.checkpoint.save's bit for bit. Returns
// the resumed run's result.
TrainResult check_resumes_exactly(const TrainConfig& straight, int64_t stop, const std::string& dir) {
  TrainConfig first = straight;
  first.training.max_steps = stop;
  first.checkpoint.save.clear();
  first.checkpoint.dir = dir + "/ckpt" + std::to_string(stop);
  first.checkpoint.every = 1000;  // only the checkpoint written when the run stops
  train_cifar10(first);
  REQUIRE(std::filesystem::exists(checkpoint_path(first.checkpoint.dir)));
  TrainConfig second = straight;
  second.checkpoint.dir = first.checkpoint.dir;
  second.checkpoint.resume = true;
  second.checkpoint.save = dir + "/resumed" + std::to_string(stop) + ".safetensors";
  TrainResult resumed = train_cifar10(second);
  check_same_weights(straight.checkpoint.save, second.checkpoint.save);
  return resumed;
}

}  // namespace

TEST_CASE("resuming mid-epoch and at an epoch boundary continues exactly") {
  const std::string dir = temp_dir("run");
  TrainConfig straight = small_run();
  straight.training.max_steps = 24;
  straight.checkpoint.save = dir + "/straight.safetensors";
  TrainResult uninterrupted = train_cifar10(straight);
  CHECK(uninterrupted.steps == 24);

  for (int64_t stop : {7, 10}) {  // 7: mid-epoch; 10: exactly at the end of epoch 1
    CAPTURE(stop);
    TrainResult resumed = check_resumes_exactly(straight, stop, dir);
    CHECK(resumed.steps == 24);
    CHECK(resumed.train_loss == doctest::Approx(uninterrupted.train_loss).epsilon(1e-12));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("--mode dp: DataParallel training resumes exactly, and its weights are the model's own keys") {
  const std::string dir = temp_dir("dp");
  TrainConfig straight = small_run();
  straight.parallel.mode = "dp";
  straight.parallel.dp_devices = 3;  // cpu:0, cpu:1, cpu:2; 32 images: chunks of 11, 11, 10
  straight.training.max_steps = 8;
  straight.checkpoint.save = dir + "/straight.safetensors";
  TrainResult uninterrupted = train_cifar10(straight);
  CHECK(uninterrupted.steps == 8);

  check_resumes_exactly(straight, 5, dir);

  // The saved keys are resnet_tiny's ("conv1.weight"), not DataParallel's "module.*": a
  // single-device run starts from them.
  auto weights = safetensors::load_file(straight.checkpoint.save);
  CHECK(weights.find("conv1.weight") != nullptr);
  TrainConfig single = small_run();
  single.model.init = straight.checkpoint.save;
  single.training.max_steps = 1;
  CHECK(std::isfinite(train_cifar10(single).train_loss));
  std::filesystem::remove_all(dir);
}

TEST_CASE("--mode mp: the ResNet cut into stages on cpu:0..2 trains bit for bit as on one device") {
  // Every stage sees the whole batch, so even BatchNorm matches: Note [Stage balance]'s
  // split changes where layers run, not what they compute.
  const std::string dir = temp_dir("mp");
  TrainConfig single = small_run();
  single.training.max_steps = 6;
  single.checkpoint.save = dir + "/single.safetensors";
  TrainResult one = train_cifar10(single);
  TrainConfig staged = single;
  staged.parallel.mode = "mp";
  staged.parallel.mp_devices = 3;
  staged.checkpoint.save = dir + "/staged.safetensors";
  TrainResult three = train_cifar10(staged);
  check_same_weights(single.checkpoint.save, staged.checkpoint.save);
  CHECK(three.train_loss == one.train_loss);
  CHECK(three.test_loss == one.test_loss);
  std::filesystem::remove_all(dir);
}

TEST_CASE("--mode pipeline: GPipe, 1F1B and checkpointed micro-batches train bit for bit alike, and resume exactly") {
  const std::string dir = temp_dir("pipe");
  TrainConfig gpipe = small_run();
  gpipe.parallel.mode = "pipeline";
  gpipe.parallel.mp_devices = 2;
  gpipe.parallel.microbatches = 3;  // 32 images: micro-batches of 11, 11, 10
  gpipe.parallel.pipeline_schedule = "gpipe";
  gpipe.training.max_steps = 6;
  gpipe.checkpoint.save = dir + "/gpipe.safetensors";
  TrainResult a = train_cifar10(gpipe);
  CHECK(a.steps == 6);
  CHECK(std::isfinite(a.train_loss));
  TrainConfig one_f_one_b = gpipe;
  one_f_one_b.parallel.pipeline_schedule = "1f1b";
  one_f_one_b.checkpoint.save = dir + "/1f1b.safetensors";
  train_cifar10(one_f_one_b);
  check_same_weights(gpipe.checkpoint.save, one_f_one_b.checkpoint.save);  // Note [Stages wait only for what they need]
  // Note [Checkpointed micro-batches are recomputed exactly]: weights and BatchNorm
  // statistics as without --pipeline-checkpoint.
  TrainConfig recomputed = one_f_one_b;
  recomputed.parallel.pipeline_checkpoint = "except_last";
  recomputed.checkpoint.save = dir + "/except_last.safetensors";
  train_cifar10(recomputed);
  check_same_weights(one_f_one_b.checkpoint.save, recomputed.checkpoint.save);

  check_resumes_exactly(one_f_one_b, 4, dir);
  std::filesystem::remove_all(dir);
}

TEST_CASE("--amp fp16: the GradScaler's state is checkpointed and resuming continues exactly") {
  const std::string dir = temp_dir("amp");
  TrainConfig straight = small_run();
  straight.training.amp = "fp16";
  straight.training.max_steps = 8;
  straight.checkpoint.save = dir + "/straight.safetensors";
  train_cifar10(straight);

  TrainConfig first = small_run();
  first.training.amp = "fp16";
  first.training.max_steps = 4;
  first.checkpoint.dir = dir + "/ckpt";
  first.checkpoint.every = 1000;
  train_cifar10(first);
  auto saved = safetensors::load_file(checkpoint_path(first.checkpoint.dir));
  REQUIRE(saved.contains("scaler.scale"));
  // Every step since the last update of the scale counts towards growth: 4 finite steps,
  // or fewer after a backoff (an overflow resets the count and halves the scale).
  const double scale = saved["scaler.scale"].item<double>();
  const int64_t tracker = saved["scaler._growth_tracker"].item<int64_t>();
  CHECK(((scale == 65536.0 && tracker == 4) || (scale < 65536.0 && tracker < 4)));

  TrainConfig second = small_run();
  second.training.amp = "fp16";
  second.training.max_steps = 8;
  second.checkpoint.dir = first.checkpoint.dir;
  second.checkpoint.resume = true;
  second.checkpoint.save = dir + "/resumed.safetensors";
  train_cifar10(second);
  check_same_weights(straight.checkpoint.save, second.checkpoint.save);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the ResNet18 recipe's pieces: Lookahead, reflect crop, alternating flip, no decay on norms and biases") {
  const std::string dir = temp_dir("recipe");
  TrainConfig straight = small_run();
  straight.training.epochs = 2;
  straight.training.max_steps = 20;  // the whole run: its last step takes the Lookahead average
  straight.optim.nesterov = true;
  straight.optim.label_smoothing = 0.1;
  straight.optim.schedule = "onecycle";
  straight.optim.no_decay_norms_and_biases = true;
  straight.optim.lookahead_every = 3;
  straight.data.crop_padding = 2;
  straight.data.padding_mode = "reflect";
  straight.data.flip = "alternating";
  straight.checkpoint.save = dir + "/straight.safetensors";
  train_cifar10(straight);
  // Lookahead's average is training state: resuming mid-epoch and at the epoch's end
  // continues exactly (Note [Lookahead in a checkpoint]).
  for (int64_t stop : {7, 10}) {
    CAPTURE(stop);
    check_resumes_exactly(straight, stop, dir);
  }
  // Each piece changes the weights (no piece is silently ignored).
  const auto trained_without = [&](const std::string& name, void (*undo)(TrainConfig&)) {
    TrainConfig other = straight;
    undo(other);
    other.checkpoint.save = dir + "/" + name + ".safetensors";
    train_cifar10(other);
    return max_weight_difference(straight.checkpoint.save, other.checkpoint.save);
  };
  CHECK(trained_without("no_lookahead", [](TrainConfig& c) { c.optim.lookahead_every = 0; }) > 0);
  CHECK(trained_without("constant", [](TrainConfig& c) { c.data.padding_mode = "constant"; }) > 0);
  CHECK(trained_without("random_flip", [](TrainConfig& c) { c.data.flip = "random"; }) > 0);
  CHECK(trained_without("decay_all", [](TrainConfig& c) { c.optim.no_decay_norms_and_biases = false; }) > 0);
  // A checkpoint with Lookahead's average is not resumed without it, nor one without it with it.
  TrainConfig first = straight;
  first.training.max_steps = 5;
  first.checkpoint.save.clear();
  first.checkpoint.dir = dir + "/mixed";
  train_cifar10(first);
  TrainConfig second = first;
  second.checkpoint.resume = true;
  second.training.max_steps = 6;
  second.optim.lookahead_every = 0;
  CHECK_THROWS_WITH_AS(train_cifar10(second), doctest::Contains("resume it with the same --lookahead-every"), Error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("resume without a checkpoint says where it looked") {
  TrainConfig c = small_run();
  c.checkpoint.dir = temp_dir("empty");
  c.checkpoint.resume = true;
  const std::string says = "--resume: no checkpoint in " + c.checkpoint.dir + ": neither a full one";
  CHECK_THROWS_WITH_AS(train_cifar10(c), doctest::Contains(says.c_str()), Error);
  std::filesystem::remove_all(c.checkpoint.dir);
}

TEST_CASE("counts out of range and unknown pipeline settings are refused before anything runs, naming the flag") {
  struct Bad {
    void (*set)(TrainConfig&);
    const char* message;
  };
  const Bad cases[] = {
      {[](TrainConfig& c) { c.parallel.microbatches = 0; },
       "--microbatches: expected at least 1 micro-batch per batch, got 0"},
      {[](TrainConfig& c) { c.training.max_steps = -7; }, "--max-steps: expected -1 (no limit) or 0 or more"},
      {[](TrainConfig& c) { c.training.epochs = 0; },
       "--epochs: expected at least 1 (--eval-only evaluates without training)"},
      {[](TrainConfig& c) { c.data.batch_size = 0; }, "--batch-size: expected at least 1, got 0"},
      {[](TrainConfig& c) { c.data.crop_padding = -1; }, "--crop-padding: expected 0 (no crop) or more pixels, got -1"},
      {[](TrainConfig& c) { c.data.flip = "sometimes"; }, "--flip: expected"},
      {[](TrainConfig& c) { c.optim.lookahead_decay = 1.5; }, "--lookahead-decay: expected a decay in [0, 1], got 1.5"},
      {[](TrainConfig& c) { c.optim.lookahead_every = -1; }, "--lookahead-every: expected 0 (off) or a number of steps"},
      {[](TrainConfig& c) { c.training.threads = -2; }, "--threads: expected 0 (OpenMP's default) or more, got -2"},
      {[](TrainConfig& c) { c.data.eval_limit = -5; },
       "--eval-limit: expected -1 (the whole test set) or 0 or more, got -5"},
      {[](TrainConfig& c) { c.parallel.dp_devices = -1; },
       "--dp-devices: expected 0 (the default devices) or more, got -1"},
      {[](TrainConfig& c) { c.checkpoint.every = -1; }, "--checkpoint-every: expected 0 (only at epoch ends) or more"},
      {[](TrainConfig& c) { c.data.workers = -1; },
       "--workers: expected 0 (load in the training thread) or more, got -1"},
      {[](TrainConfig& c) { c.optim.name = "lamb"; }, "--optimizer: expected sgd or adamw, got 'lamb'"},
      {[](TrainConfig& c) { c.optim.schedule = "step"; },
       "--schedule: expected none, cosine, onecycle or warmup_cosine, got 'step'"},
      {[](TrainConfig& c) { c.optim.clip_grad_norm = -1; }, "--clip-grad-norm: expected 0 (no clipping) or a positive"},
      {[](TrainConfig& c) { c.training.amp = "fp8"; }, "--amp: expected none, bf16 or fp16, got 'fp8'"},
      {[](TrainConfig& c) { c.training.memory_format = "nhwc"; },
       "--memory-format: expected auto, contiguous or channels_last, got 'nhwc'"},
      {[](TrainConfig& c) { c.parallel.mode = "zero"; }, "--mode: expected single, dp, mp, pipeline, ddp or fsdp, got 'zero'"},
      {[](TrainConfig& c) { c.parallel.backend = "mpi"; }, "--backend: expected gloo or nccl"},
      {[](TrainConfig& c) { c.checkpoint.format = "zip"; }, "--checkpoint-format: expected full (FULL_STATE_DICT"},
      {[](TrainConfig& c) { c.parallel.pipeline_checkpoint = "sometimes"; },
       "--pipeline-checkpoint: expected never, except_last or always, got 'sometimes'"},
      {[](TrainConfig& c) { c.parallel.pipeline_schedule = "zb"; },
       "--pipeline-schedule: expected gpipe, 1f1b or interleaved_1f1b, got 'zb'"},
      {[](TrainConfig& c) { c.parallel.virtual_stages = 2; },
       "--virtual-stages 2 needs --pipeline-schedule interleaved_1f1b, got 1f1b"},
      {[](TrainConfig& c) {
         c.parallel.mode = "mp";
         c.parallel.pp = 2;
       },
       "--pp 2 runs the stages of a pipeline as processes: alone, with --mode pipeline or ddp, or with "
       "--dp-replicate; got --mode mp"},
      {[](TrainConfig& c) { c.parallel.balance = {7, 7}; },
       "--balance cuts the model into stages: it needs --mode mp or pipeline"},
      {[](TrainConfig& c) {
         c.parallel.mode = "pipeline";
         c.parallel.balance = {1, 2};
       },
       "--balance: expected 2 positive layer counts (one per virtual stage: stages × --virtual-stages) adding up to "
       "the Sequential's length"},
      {[](TrainConfig& c) {
         c.parallel.mode = "single";
         c.parallel.pipeline_checkpoint = "always";
       },
       "--pipeline-checkpoint always recomputes a pipeline's micro-batches: it needs --mode pipeline or --pp, got "
       "--mode single"},
  };
  for (const Bad& bad : cases) {
    CAPTURE(bad.message);
    TrainConfig c = small_run();
    bad.set(c);
    CHECK_THROWS_WITH_AS(train_cifar10(c), doctest::Contains(bad.message), Error);
  }
  TrainConfig eval = small_run();
  eval.training.epochs = 0;  // --eval-only needs no epochs
  eval.training.eval_only = true;
  eval.data.eval_limit = 300;  // not a whole number of the test loader's 256-image batches
  // --metrics-json is written by an evaluation too, with the keys a training run writes.
  eval.metrics.json = temp_dir("eval_metrics") + "/metrics.json";
  CHECK(train_cifar10(eval).test_images == 300);
  {
    std::ifstream in(eval.metrics.json);
    REQUIRE_MESSAGE(in, "--eval-only wrote no ", eval.metrics.json);
    std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const char* key : {"\"test_loss\": ", "\"test_acc\": ", "\"test_images\": 300", "\"train_loss\": ",
                            "\"img_per_s\": ", "\"peak_memory_mib\": ", "\"steps\": 0", "\"epochs\": 0"})
      CHECK_MESSAGE(json.find(key) != std::string::npos, key, " missing from ", json);
  }
  std::filesystem::remove_all(std::filesystem::path(eval.metrics.json).parent_path());
  eval.metrics.json.clear();
  eval.data.eval_limit = 0;
  const TrainResult none = train_cifar10(eval);
  CHECK(none.test_images == 0);
  CHECK(none.test_loss == 0);
}

TEST_CASE("--tta: the trainer's evaluation is nn::tta_logits over the same weights and test images") {
  const std::string dir = temp_dir("tta");
  TrainConfig train = small_run();
  train.training.max_steps = 10;
  train.checkpoint.save = dir + "/w.safetensors";
  train_cifar10(train);

  TrainConfig eval = small_run();
  eval.training.epochs = 0;
  eval.training.eval_only = true;
  eval.model.init = train.checkpoint.save;
  eval.data.eval_limit = 300;                  // two of the test loader's batches, the second short
  eval.training.memory_format = "contiguous";  // the kernels the reference below runs
  const TrainResult plain = train_cifar10(eval);
  eval.training.tta = "mirror_translate";
  const TrainResult tta = train_cifar10(eval);
  CHECK(tta.test_images == 300);

  // The reference: the saved weights in a fresh model, the first 300 test images, six views.
  std::shared_ptr<nn::Module> model = model_spec(eval.model.name).build(eval.model.name, 10);
  nn::load(*model, train.checkpoint.save);
  model->eval();
  std::vector<int64_t> first(300);
  for (int64_t i = 0; i < 300; ++i) first[static_cast<size_t>(i)] = i;
  const data::Batch batch = make_dataset(eval, /*train=*/false)->get_batch(first, data::AugmentSeed{});
  const Tensor logits = nn::tta_logits(*model, batch.data, nn::TTA::mirror_translate);
  const double loss = nn::CrossEntropyLoss()(logits, batch.target).item<float>();
  const double correct = static_cast<double>(sum(eq(argmax(logits, 1), batch.target)).to(kInt64).item<int64_t>());
  CHECK(tta.test_loss == doctest::Approx(loss).epsilon(1e-5));
  CHECK(tta.test_acc == doctest::Approx(correct / 300).epsilon(1e-12));
  // The six views change the answer, so a trainer that ignored --tta would fail the checks above.
  CHECK(std::abs(plain.test_loss - loss) > 1e-3);
  std::filesystem::remove_all(dir);
}
