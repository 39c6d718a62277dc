// Stages as processes under loomrun (tests/pipeline_worker.cpp): 2 and 3 processes, one
// stage each, under GPipe, 1F1B and interleaved 1F1B, save the same weights as the
// in-process Pipeline with the same balance, micro-batches and schedule after 2 SGD steps; a
// stage's process that dies mid-step makes loomrun stop the others, naming it. The same
// train_cifar10 --pp command saves the same bytes whether the machine is idle or busy,
// and every rank of a pp x dp world cuts the model alike.
#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "nn/safetensors.h"   // defines: load_file
#include "busy_cores.h"      // defines: run_idle_then_busy
#include "process_launch.h"   // defines: Launch, Result, TempDir, path_from_env, contains

using namespace loom;
using namespace loom::testing;

TEST_CASE("a pipeline of processes under loomrun saves the in-process pipeline's weights, bit for bit") {
  TempDir dir("loom_pipeline_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), worker = path_from_env("PIPELINE_WORKER");
  struct Case {
    int ranks;
    std::string schedule, balance;
    int n_microbatches;
  };
  for (const Case& c : {Case{2, "gpipe", "2,4", 4}, Case{2, "1f1b", "3,3", 3}, Case{2, "interleaved_1f1b", "1,2,1,2", 4},
                        Case{3, "1f1b", "2,2,2", 4}, Case{3, "interleaved_1f1b", "1,1,1,1,1,1", 3}}) {
    CAPTURE(c.schedule);
    CAPTURE(c.ranks);
    const std::string want = (dir.path / "reference.safetensors").string(), got = (dir.path / "processes.safetensors").string();
    const std::string n = std::to_string(c.ranks), n_microbatches = std::to_string(c.n_microbatches);
    Result reference = Launch(worker + " reference " + c.schedule + " " + c.balance + " " + n + " " + n_microbatches + " " + want).finish();
    REQUIRE_MESSAGE(reference.code == 0, reference.output);
    Result processes = Launch(loomrun + " --standalone --nproc_per_node " + n + " " + worker + " processes " +
                              c.schedule + " " + c.balance + " " + n_microbatches + " " + got).finish();
    REQUIRE_MESSAGE(processes.code == 0, processes.output);
    CHECK(contains(processes.output, "loss "));
    auto a = safetensors::load_file(want), b = safetensors::load_file(got);
    REQUIRE(a.size() == b.size());
    for (const auto& [key, tensor] : a) {
      const std::string& name = key;  // See Note [doctest messages name no structured binding]
      CAPTURE(name);
      CHECK(tensor.tolist<double>() == b.find(name)->tolist<double>());
    }
  }
}

TEST_CASE("a stage's process that dies mid-step: loomrun stops the others and names it") {
  TempDir dir("loom_pipeline_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), worker = path_from_env("PIPELINE_WORKER");
  Result r = Launch(loomrun + " --standalone --nproc_per_node 3 " + worker + " processes 1f1b 2,2,3 4 " +
                    (dir.path / "never.safetensors").string() + " 1").finish();
  CHECK(r.code != 0);
  CHECK(r.seconds < 30);
  CHECK_MESSAGE(contains(r.output, "pipeline_worker: dying in forward call 2"), r.output);
  CHECK_MESSAGE(contains(r.output, "rank 1"), r.output);
}

TEST_CASE("train_cifar10 --mode pipeline --pp P under loomrun saves the in-process pipeline's weights, bit for bit") {
  TempDir dir("loom_pipeline_train");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  // The tiny ResNet's Sequential has 10 layers; BatchNorm normalises each micro-batch alike
  // in both. Sequential order and no augmentation: the same batches in both runs.
  const std::string common = " --mode pipeline --model tiny --synthetic --max-steps 2 --batch-size 8 --eval-limit 40 "
                             "--threads 1 --workers 0 --quiet --no-shuffle --no-augment --microbatches 4";
  struct Case {
    int ranks;
    std::string flags;
  };
  for (const Case& c : {Case{2, "--pipeline-schedule gpipe --balance 5,5"}, Case{2, "--pipeline-schedule 1f1b"},
                        Case{2, "--pipeline-schedule 1f1b --pipeline-checkpoint always"},
                        Case{2, "--pipeline-schedule interleaved_1f1b --virtual-stages 2 --balance 3,2,3,2"},
                        Case{3, "--pipeline-schedule interleaved_1f1b --virtual-stages 2 --balance 2,2,1,2,2,1"}}) {
    CAPTURE(c.flags);
    CAPTURE(c.ranks);
    const std::string n = std::to_string(c.ranks);
    const std::string want = (dir.path / "threads.safetensors").string(), got = (dir.path / "processes.safetensors").string();
    Result threads = Launch(train + common + " " + c.flags + " --mp-devices " + n + " --save " + want).finish();
    REQUIRE_MESSAGE(threads.code == 0, threads.output);
    Result processes = Launch(loomrun + " --standalone --nproc_per_node " + n + " " + train + common + " " + c.flags +
                              " --pp " + n + " --save " + got).finish();
    REQUIRE_MESSAGE(processes.code == 0, processes.output);
    // The same progress line: loss and accuracy (all-reduced from the last stage), and the
    // evaluation of the whole model after share_weights.
    const auto line = [](const std::string& out) { return out.substr(out.find("epoch 1/"), out.find(" time") - out.find("epoch 1/")); };
    CHECK(line(threads.output) == line(processes.output));
    auto a = safetensors::load_file(want), b = safetensors::load_file(got);
    REQUIRE(a.size() == b.size());
    for (const auto& [key, tensor] : a) {
      const std::string& name = key;  // See Note [doctest messages name no structured binding]
      CAPTURE(name);
      CHECK(tensor.to(kFloat64).tolist<double>() == b.find(name)->to(kFloat64).tolist<double>());
    }
  }
  // Recomputation inside the stage processes is exact: --pipeline-checkpoint always saves
  // what keeping the activations saves.
  const std::string kept = (dir.path / "kept.safetensors").string(), redone = (dir.path / "redone.safetensors").string();
  for (const auto& [policy, path] : {std::pair{"never", kept}, {"always", redone}}) {
    Result r = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + common + " --pipeline-schedule 1f1b --pp 2 "
                      "--pipeline-checkpoint " + policy + " --save " + path).finish();
    REQUIRE_MESSAGE(r.code == 0, r.output);
  }
  CHECK(read_file(kept) == read_file(redone));
  // Flags that cannot work are refused, naming them.
  Result bad = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + common + " --pp 2 --balance 4,4").finish();
  CHECK(bad.code != 0);
  CHECK_MESSAGE(contains(bad.output, "--balance: expected 2 positive layer counts (one per virtual stage: stages × --virtual-"
                                     "stages) adding up to the Sequential's length, 10 layers; got 2 entries adding up to 8"),
                bad.output);
  Result three = Launch(loomrun + " --standalone --nproc_per_node 3 " + train + common + " --pp 2").finish();
  CHECK(three.code != 0);
  CHECK_MESSAGE(contains(three.output, "WORLD_SIZE is 3"), three.output);
}


TEST_CASE("the same --pp 2 command, run on an idle and on a busy machine, saves byte-identical weights") {
  TempDir dir("loom_pipeline_repeat");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  // Under --amp bf16 the cut decides where activations are rounded: a balance that moved
  // with the load would change the weights.
  const std::string command = loomrun + " --standalone --nproc_per_node 2 " + train +
                              " --mode pipeline --pp 2 --model tiny --synthetic --max-steps 3 --batch-size 16 "
                              "--eval-limit 16 --threads 1 --workers 0 --no-shuffle --amp bf16 --microbatches 4 --save ";
  const std::string idle = (dir.path / "idle.safetensors").string(), busy = (dir.path / "busy.safetensors").string();
  const std::pair<Result, Result> runs = run_idle_then_busy(command + idle, command + busy);
  const Result &first = runs.first, &second = runs.second;  // Note [doctest messages name no structured binding]
  CHECK_MESSAGE(contains(first.output, "pipeline balance: "), first.output);
  CHECK_MESSAGE(contains(first.output, " (by cost)"), first.output);
  const auto balance_line = [](const std::string& out) {
    const size_t at = out.find("pipeline balance: ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  CHECK(balance_line(first.output) == balance_line(second.output));
  const std::string a = read_file(idle), b = read_file(busy);
  REQUIRE(!a.empty());
  CHECK_MESSAGE(a == b, "the saved weights differ between the idle and the busy run");
}

TEST_CASE("--balance time under pp x dp: measured once, printed once, and every rank cuts alike") {
  TempDir dir("loom_pipeline_time");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  Result r = Launch(loomrun + " --standalone --nproc_per_node 4 " + train +
                    " --mode ddp --pp 2 --balance time --model tiny --synthetic --max-steps 2 --batch-size 8 "
                    "--eval-limit 8 --threads 1 --workers 0 --microbatches 2").finish();
  REQUIRE_MESSAGE(r.code == 0, r.output);
  size_t lines = 0;
  for (size_t at = r.output.find("pipeline balance: "); at != std::string::npos;
       at = r.output.find("pipeline balance: ", at + 1))
    ++lines;
  CHECK_MESSAGE(lines == 1, r.output);
  CHECK_MESSAGE(contains(r.output, " (by time)"), r.output);
  CHECK_MESSAGE(contains(r.output, "parallel dims: pp=2 dp_replicate=2 dp_shard=1 tp=1 (world 4)"), r.output);
  Result bad = Launch(loomrun + " --standalone --nproc_per_node 2 " + train +
                      " --mode pipeline --pp 2 --balance flops --model tiny --synthetic --max-steps 1").finish();
  CHECK(bad.code != 0);
  CHECK_MESSAGE(contains(bad.output, "--balance: expected cost, time or comma-separated layer counts such as 7,7, got "
                                     "'flops'"),
                bad.output);
}
