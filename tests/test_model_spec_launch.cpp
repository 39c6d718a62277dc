// A model the trainer has never heard of, added through a ModelSpec alone (Note [Adding a
// model to the trainer], train/model_spec.h): this test's binary registers ToyNet and is
// then a train_cifar10 for it (run with --toy-trainer first), and the tests launch it under
// loomrun as users launch train_cifar10. Under DDP, FSDP (either layout), TP and a pipeline
// of processes it trains as its reference runs do, from the same --init; so does the
// built-in speedrun net, whose spec is one file too (train/models/airbench.cpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <unistd.h>  // defines: readlink

#include <climits>
#include <string>

#include "nn/nn.h"
#include "parallel/tensor/parallelize_module.h"  // defines: ParallelizePlan, ColwiseParallel, RowwiseParallel
#include "process_launch.h"                      // defines: Launch, Result, TempDir, under_loomrun, contains
#include "saved_weights.h"                       // defines: max_weight_difference
#include "train/command_line.h"                  // defines: train_main
#include "train/model_spec.h"                    // defines: ModelSpec, register_model_spec

using namespace loom;
using namespace loom::testing;

namespace {

// x + conv2(relu(conv1(x))): the toy's block, the unit FSDP shards and TP splits.
class ToyBlock : public nn::Cloneable<ToyBlock> {
 public:
  explicit ToyBlock(int64_t channels_) : Cloneable("ToyBlock"), channels(channels_) { reset(); }
  void reset() override {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(channels, 2 * channels, 3, 1, 1));
    conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(2 * channels, channels, 3, 1, 1));
  }
  Tensor forward(const Tensor& x) override { return x + (*conv2)(relu((*conv1)(x))); }
  int64_t channels;
  std::shared_ptr<nn::Conv2d> conv1, conv2;
};

// stem, two blocks, pooling and a linear head; its layers in order for pipelines and FSDP.
class ToyNet : public nn::Cloneable<ToyNet> {
 public:
  explicit ToyNet(int64_t classes_) : Cloneable("ToyNet"), classes(classes_) { reset(); }
  void reset() override {
    stem = register_module("stem", std::make_shared<nn::Conv2d>(3, 8, 3, 2, 1));
    act = register_module("act", std::make_shared<nn::ReLU>());
    block1 = register_module("block1", std::make_shared<ToyBlock>(8));
    block2 = register_module("block2", std::make_shared<ToyBlock>(8));
    pool = register_module("pool", std::make_shared<nn::AdaptiveAvgPool2d>(1));
    flatten = register_module("flatten", std::make_shared<nn::Flatten>());
    head = register_module("head", std::make_shared<nn::Linear>(8, classes));
  }
  Tensor forward(const Tensor& x) override { return (*sequential())(x); }
  std::shared_ptr<nn::Sequential> sequential() const override {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{stem, act, block1, block2, pool,
                                                                                     flatten, head});
  }
  int64_t classes;
  std::shared_ptr<nn::Conv2d> stem;
  std::shared_ptr<nn::ReLU> act;
  std::shared_ptr<ToyBlock> block1, block2;
  std::shared_ptr<nn::AdaptiveAvgPool2d> pool;
  std::shared_ptr<nn::Flatten> flatten;
  std::shared_ptr<nn::Linear> head;
};

// The whole of what the trainer needs to know about ToyNet.
training::ModelSpec toy_spec() {
  return {
      .family = "toy",
      .names = {"toy_net"},
      .build = [](const std::string&, int64_t classes) { return std::make_shared<ToyNet>(classes); },
      .block_types = {"ToyBlock"},
      .tp_plan = [](const nn::Module&, int) {
        return distributed::ParallelizePlan{{"block*.conv1", distributed::ColwiseParallel()},
                                            {"block*.conv2", distributed::RowwiseParallel()}};
      },
      .no_weight_decay = nullptr,
  };
}

// The same family without a tensor-parallel plan: --tp is refused, naming it
// (docs/limitations.md runs the trainer below with it).
training::ModelSpec plain_toy_spec() {
  training::ModelSpec plain = toy_spec();
  plain.family = "plain toy";
  plain.names = {"plain_toy_net"};
  plain.tp_plan = nullptr;
  return plain;
}

std::string self_path() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  REQUIRE(n > 0);
  return std::string(path, static_cast<size_t>(n));
}

const std::string kCommon = " --model toy_net --synthetic --max-steps 3 --eval-limit 0 --threads 1 --workers 0 --quiet";

// The toy trainer with `flags`, in one process or as `ranks` loomrun workers.
std::string toy(int ranks, const std::string& flags) {
  const std::string program = self_path() + " --toy-trainer" + kCommon + " " + flags;
  return ranks == 1 ? program : under_loomrun(ranks, program);
}

}  // namespace

TEST_CASE("a model added by a ModelSpec alone trains under DDP, FSDP, TP and a pipeline of processes") {
  TempDir dir("loom_model_spec_launch");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(toy(1, "--max-steps 0 --save " + init)).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const std::string from = " --init " + init;
  // Data parallel: 2 ranks of 6 images each; FSDP in either layout = DDP to the bit.
  const std::string ddp = run_saving_weights(dir, toy(2, "--batch-size 6 --dp-replicate 2" + from), "ddp");
  for (const std::string layout : {"per_parameter", "flat"}) {
    CAPTURE(layout);
    const std::string fsdp =
        run_saving_weights(dir, toy(2, "--batch-size 6 --dp-shard 2 --fsdp-layout " + layout + from), "fsdp_" + layout);
    check_same_weights(ddp, fsdp);
  }
  // Model parallel: the whole batch of 12 on every rank, against one process.
  const std::string one = run_saving_weights(dir, toy(1, "--batch-size 12" + from), "one");
  CHECK(max_weight_difference(one, run_saving_weights(dir, toy(2, "--batch-size 12 --tp 2" + from), "tp")) <= 1e-5);
  CHECK(max_weight_difference(one, run_saving_weights(dir, toy(2, "--batch-size 12 --pp 2 --microbatches 1" + from),
                                                      "pp")) <= 1e-5);
  // --help lists it among the models.
  Result help = Launch(self_path() + " --toy-trainer --help").finish();
  CHECK_MESSAGE(contains(help.output, "| toy_net"), help.output);
}

TEST_CASE("weight-decay groups hold in every layout: no decay on biases under FSDP and a pipeline of FSDP = DDP") {
  // --no-decay-norms-and-biases and AdamW's groups are decided on the whole parameters'
  // names and shapes; FSDP's shards and a stage's own names must reach the same groups.
  TempDir dir("loom_model_spec_decay");
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(toy(1, "--max-steps 0 --save " + init)).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const std::string from = " --init " + init + " --lr 0.1 --weight-decay 0.5 ";
  for (const std::string groups : {"--no-decay-norms-and-biases", "--optimizer adamw"}) {
    CAPTURE(groups);
    const std::string ddp = run_saving_weights(dir, toy(2, "--batch-size 6 --dp-replicate 2" + from + groups), "ddp");
    check_same_weights(ddp, run_saving_weights(dir, toy(2, "--batch-size 6 --dp-shard 2" + from + groups), "fsdp"));
    CHECK(max_weight_difference(ddp, run_saving_weights(dir, toy(4, "--batch-size 6 --pp 2 --dp-shard 2 "
                                                                    "--microbatches 1" + from + groups),
                                                        "pp_fsdp")) <= 1e-5);
  }
  // The groups matter at this size: all-decay DDP is another model.
  const std::string ddp = run_saving_weights(dir, toy(2, "--batch-size 6 --dp-replicate 2" + from +
                                                            "--no-decay-norms-and-biases"), "ddp_groups");
  CHECK(max_weight_difference(ddp, run_saving_weights(dir, toy(2, "--batch-size 6 --dp-replicate 2" + from),
                                                      "ddp_all")) > 1e-3);
  // FSDP1's flat shard of a block holds its weights and biases together: no group fits it.
  Result flat = Launch(toy(2, "--batch-size 6 --dp-shard 2 --fsdp-layout flat --no-decay-norms-and-biases" + from))
                    .finish();
  CHECK(flat.code != 0);
  CHECK_MESSAGE(contains(flat.output, "hold pieces of both kinds (FSDP's flat shards)"), flat.output);
}

TEST_CASE("the speedrun net trains through its spec: FSDP = DDP, TP and a pipeline = one process") {
  // train_cifar10 --model airbench94 (train/models/airbench.cpp): its frozen whitening conv
  // and BatchNorm weights ride along in every cut. Direct convolutions: its 3x3 convolutions
  // have the channels for Winograd, whose tile transforms round differently at a tp rank's
  // half of them (1e-3 apart after two steps; direct: 7e-7; Note [Conv2d algorithm]).
  TempDir dir("loom_model_spec_airbench");
  const auto run = [](int ranks, const std::string& flags) {
    const std::string program = self_path() + " --toy-trainer --model airbench94 --synthetic --max-steps 2 "
                                "--eval-limit 0 --threads 1 --workers 0 --quiet " + flags;
    return "env LOOM_CONV2D_ALGO=direct " + (ranks == 1 ? program : under_loomrun(ranks, program));
  };
  const std::string init = (dir.path / "init.safetensors").string();
  Result made = Launch(run(1, "--max-steps 0 --save " + init)).finish();
  REQUIRE_MESSAGE(made.code == 0, made.output);
  const std::string from = " --init " + init;
  const std::string ddp = run_saving_weights(dir, run(2, "--batch-size 6 --dp-replicate 2" + from), "ddp");
  check_same_weights(ddp, run_saving_weights(dir, run(2, "--batch-size 6 --dp-shard 2" + from), "fsdp"));
  const std::string one = run_saving_weights(dir, run(1, "--batch-size 12" + from), "one");
  CHECK(max_weight_difference(one, run_saving_weights(dir, run(2, "--batch-size 12 --tp 2" + from), "tp")) <= 1e-5);
  CHECK(max_weight_difference(one, run_saving_weights(dir, run(2, "--batch-size 12 --pp 2 --microbatches 1" + from),
                                                      "pp")) <= 1e-5);
}

TEST_CASE("a spec without a tp plan refuses --tp, naming the family; a name registered twice is refused") {
  Result tp = Launch(under_loomrun(2, self_path() + " --toy-trainer --model plain_toy_net --synthetic --max-steps 1 "
                                      "--eval-limit 0 --threads 1 --workers 0 --quiet --tp 2")).finish();
  CHECK(tp.code != 0);
  CHECK_MESSAGE(contains(tp.output, "the plain toy family (--model plain_toy_net) has none"), tp.output);
  training::ModelSpec plain = plain_toy_spec();
  training::register_model_spec(plain);
  CHECK_THROWS_WITH_AS(training::register_model_spec(plain), doctest::Contains("--model plain_toy_net is registered"),
                       Error);
  CHECK(training::model_spec("plain_toy_net").family == "plain toy");
  CHECK_THROWS_WITH_AS(training::model_spec("toy_nett"), doctest::Contains("unknown model 'toy_nett': expected one of"),
                       Error);
}

int main(int argc, char** argv) {
  // Launched by the tests above: a trainer of ToyNet, exactly as train_cifar10 is of the
  // built-in models.
  if (argc > 1 && std::string(argv[1]) == "--toy-trainer") {
    training::register_model_spec(toy_spec());
    training::register_model_spec(plain_toy_spec());
    argv[1] = argv[0];
    return training::train_main(argc - 1, argv + 1);
  }
  doctest::Context context(argc, argv);
  return context.run();
}
