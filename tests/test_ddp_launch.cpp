// train_cifar10 --mode ddp under loomrun, as users run it: real processes, real TCP.
// meson passes the launcher's and the trainer's paths in LOOMRUN and TRAIN_CIFAR10.
//
// The contract checked here: two nodes of one process each train exactly like one node
// of two processes (bitwise-identical weights), since the ranks, their data shards and
// every collective are the same; and LOOM_TRACE / LOOM_DISTRIBUTED_DEBUG do what they say.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cuda/device.h"  // defines: is_available
#include "nn/json.h"
#include "parallel/store/socket.h"
#include "process_launch.h"  // defines: Launch, Result, TempDir, path_from_env, contains

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::testing;

namespace {


// A tiny, fast run: 5 optimizer steps of a narrow ResNet on synthetic images.
const std::string kTrainArgs =
    " --mode ddp --model tiny --synthetic --max-steps 5 --batch-size 8 --eval-limit 50 --threads 1 --workers 0 --quiet";

}  // namespace

TEST_CASE("two nodes x 1 process train bitwise like one node x 2 processes; traces and bucket layout on request") {
  TempDir dir("loom_ddp_launch");
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  const fs::path one = dir.path / "one_node", two = dir.path / "two_nodes";
  fs::create_directories(one);
  fs::create_directories(two);

  Result single_node = Launch("LOOM_TRACE=" + (one / "trace.json").string() + " LOOM_DISTRIBUTED_DEBUG=info " +
                              loomrun + " --standalone --nproc_per_node 2 " + train + kTrainArgs + " --save " +
                              (one / "w.safetensors").string() + " --metrics-json " + (one / "m.json").string())
                           .finish();
  REQUIRE_MESSAGE(single_node.code == 0, single_node.output);
  CHECK_MESSAGE(contains(single_node.output, "DDP bucket layout (rank 0 of 2)"), single_node.output);

  const std::string node = " --nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 --master_port " +
                           std::to_string(distributed::net::find_free_port()) + " ";
  Launch node1(loomrun + " --node_rank 1" + node + train + kTrainArgs);
  Launch node0(loomrun + " --node_rank 0" + node + train + kTrainArgs + " --save " + (two / "w.safetensors").string() +
               " --metrics-json " + (two / "m.json").string());
  Result r0 = node0.finish(), r1 = node1.finish();
  REQUIRE_MESSAGE(r0.code == 0, r0.output);
  REQUIRE_MESSAGE(r1.code == 0, r1.output);

  std::string weights_one = read_file(one / "w.safetensors"), weights_two = read_file(two / "w.safetensors");
  CHECK(weights_one.size() > 10000);
  CHECK(weights_one == weights_two);  // bitwise
  json::Value m1 = json::parse(read_file(one / "m.json")), m2 = json::parse(read_file(two / "m.json"));
  for (const char* key : {"train_loss", "train_acc", "test_loss", "test_acc"}) {
    CAPTURE(key);
    CHECK(m1[key].as_double() == m2[key].as_double());
  }
  CHECK(m1["steps"].as_int() == 5);

  // LOOM_TRACE with two ranks: one file each, with the buckets' all_reduce spans.
  for (const char* rank : {"0", "1"}) {
    std::string trace = read_file(one / (std::string("trace.rank") + rank + ".json"));
    CHECK(contains(trace, "\"all_reduce bucket 0\""));
    CHECK(contains(trace, "\"backward\""));
    CHECK(json::parse(trace)["traceEvents"].as_array().size() > 10);
  }
}

// (With a GPU the nccl backend exists: tests/test_comm_nccl.cpp.)
TEST_CASE("--backend nccl without a GPU (or without NCCL): a clear error" * doctest::skip(cuda::is_available())) {
  Result r = Launch(path_from_env("LOOMRUN") + " --standalone --nproc_per_node 2 " + path_from_env("TRAIN_CIFAR10") +
                    kTrainArgs + " --device cuda --backend nccl")
                 .finish();
  CHECK(r.code != 0);
  // train_cifar10 checks --device before it joins the process group (train/
  // device.h), so without a GPU that check speaks first: why, and to train on the CPU
  // (where --mode ddp picks gloo).
  CHECK_MESSAGE(contains(r.output, cuda::is_compiled() ? "--device cuda: no CUDA device is available"
                                                       : "--device cuda: this loom was built without the CUDA backend"),
                r.output);
  CHECK_MESSAGE(contains(r.output, "--device cpu"), r.output);
}

TEST_CASE("--device-memory-limit under DDP: a rank past its budget fails with the OOM report and loomrun stops the run") {
  const std::string loomrun = path_from_env("LOOMRUN"), train = path_from_env("TRAIN_CIFAR10");
  // 1 MiB on cpu:1: the tiny model's state fits, its first activations do not.
  const Result r = Launch(loomrun + " --standalone --nproc_per_node 2 " + train + kTrainArgs +
                          " --device cpu:1 --device-memory-limit 1MiB")
                       .finish();
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(contains(r.output, "CPU out of memory. Tried to allocate "));
  CHECK(contains(r.output, "1.00 MiB allowed (set_per_process_memory_fraction / set_device_memory_limit)"));
  CHECK(contains(r.output, "loomrun: failed: worker rank "));
}
