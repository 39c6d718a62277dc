// Stages as processes under loomrun (tests/pipeline_worker.cpp): 2 and 3 processes, one
// stage each, under GPipe, 1F1B and interleaved 1F1B, save the same weights as the
// in-process Pipeline with the same balance, chunks and schedule after 2 SGD steps; a
// stage's process that dies mid-step makes loomrun stop the others, naming it.
#include <doctest/doctest.h>

#include <string>

#include "core/tensor.h"
#include "nn/safetensors.h"   // defines: load_file
#include "process_launch.h"   // defines: Launch, Result, TempDir, path_from_env, contains

using namespace loom;
using namespace loom::testing;

TEST_CASE("a pipeline of processes under loomrun saves the in-process pipeline's weights, bit for bit") {
  TempDir dir("loom_pipeline_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), worker = path_from_env("PIPELINE_WORKER");
  struct Case {
    int ranks;
    std::string schedule, balance;
    int chunks;
  };
  for (const Case& c : {Case{2, "gpipe", "2,4", 4}, Case{2, "1f1b", "3,3", 3}, Case{2, "interleaved_1f1b", "1,2,1,2", 4},
                        Case{3, "1f1b", "2,2,2", 4}, Case{3, "interleaved_1f1b", "1,1,1,1,1,1", 3}}) {
    CAPTURE(c.schedule);
    CAPTURE(c.ranks);
    const std::string want = (dir.path / "reference.safetensors").string(), got = (dir.path / "processes.safetensors").string();
    const std::string n = std::to_string(c.ranks), chunks = std::to_string(c.chunks);
    Result reference = Launch(worker + " reference " + c.schedule + " " + c.balance + " " + n + " " + chunks + " " + want).finish();
    REQUIRE_MESSAGE(reference.code == 0, reference.output);
    Result processes = Launch(loomrun + " --standalone --nproc_per_node " + n + " " + worker + " processes " +
                              c.schedule + " " + c.balance + " " + chunks + " " + got).finish();
    REQUIRE_MESSAGE(processes.code == 0, processes.output);
    CHECK(contains(processes.output, "loss "));
    auto a = safetensors::load_file(want), b = safetensors::load_file(got);
    REQUIRE(a.size() == b.size());
    for (const auto& [name, tensor] : a) {
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
