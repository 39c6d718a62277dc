// Sharded checkpoints (parallel/distributed_checkpoint.h, parallel/fsdp/sharded_state_dict.h):
// every rank writes its shard, rank 0 the manifest last; a set the manifest does not
// vouch for is never loaded. Ranks are threads (tests/rank_threads.h).
//
// Mutation checks (run by hand, see the commit that added this file): with
// find_latest_complete taking the newest step directory without asking why_incomplete,
// or with why_incomplete checking only that the manifest exists, the "half-written" case
// below fails -- it resumes from the damaged step.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "autograd/ops.h"
#include "core/atomic_file.h"                 // defines: read_whole_file, write_file_atomically
#include "nn/nn.h"
#include "nn/optim/sgd.h"
#include "nn/resnet.h"                        // defines: resnet_tiny (BatchNorm buffers to keep)
#include "nn/safetensors.h"                   // defines: safetensors::serialize (bytes to compare)
#include "parallel/distributed_checkpoint.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/fsdp/sharded_state_dict.h"
#include "parallel/fsdp/state_dict.h"         // defines: full_state_dict (to compare whole models)
#include "rank_threads.h"                     // defines: run_ranks, require_no_errors
#include "temp_dir.h"                         // defines: TempDir

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::testing;
using distributed::Communicator;
namespace ckpt = loom::distributed::checkpoint;

namespace {

OrderedDict<Tensor> prefixed(const std::string& prefix, const OrderedDict<Tensor>& part) {
  OrderedDict<Tensor> out;
  for (const auto& [key, value] : part) out.insert(prefix + key, value);
  return out;
}

OrderedDict<Tensor> take(const OrderedDict<Tensor>& all, const std::string& prefix) {
  OrderedDict<Tensor> out;
  for (const auto& [key, value] : all)
    if (key.rfind(prefix, 0) == 0) out.insert(key.substr(prefix.size()), value);
  return out;
}

// Bitwise equality of two dicts: the same safetensors bytes.
std::string bytes(const OrderedDict<Tensor>& state) { return safetensors::serialize(state); }

// Two SGD steps (momentum) of FSDP over `model` on this rank's part of fixed batches.
void train_two_steps(fsdp::FullyShardedDataParallel& fsdp, optim::SGD& opt, const std::vector<Tensor>& images,
                     const std::vector<Tensor>& labels, int rank, int world) {
  for (size_t s = 0; s < images.size(); ++s) {
    const int64_t per = images[s].size(0) / world;
    Tensor loss = cross_entropy(fsdp(images[s].narrow(0, rank * per, per)), labels[s].narrow(0, rank * per, per));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// Every rank's shard of an FSDP-trained resnet_tiny (model and optimizer) in `step_dir`,
// then the manifest; returns each rank's whole model and optimizer state as bytes.
struct Written {
  std::vector<std::string> model, optimizer;
};
Written write_set(const std::string& step_dir, int world, fsdp::ShardingStrategy strategy) {
  manual_seed(11);
  auto start = nn::resnet_tiny(10, 4);
  std::vector<Tensor> images, labels;
  for (int s = 0; s < 2; ++s) {
    images.push_back(randn({2 * world, 3, 8, 8}));
    labels.push_back(randint(0, 10, {2 * world}));
  }
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  Written out{std::vector<std::string>(world), std::vector<std::string>(world)};
  require_no_errors(run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    fsdp::FullyShardedDataParallel fsdp(replicas[r], comm, {.sharding_strategy = strategy});
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
    train_two_steps(fsdp, opt, images, labels, r, world);
    OrderedDict<Tensor> tensors = prefixed("model.", fsdp::sharded_state_dict(fsdp));
    for (const auto& [key, value] : prefixed("optimizer.", opt.state_dict())) tensors.insert(key, value);
    ckpt::write_shard(step_dir, r, world, tensors, fsdp::sharding_metadata(fsdp));
    comm->barrier()->wait();  // See Note [The manifest is written last].
    if (r == 0) ckpt::write_manifest(step_dir, world);
    out.model[r] = bytes(fsdp::full_state_dict(fsdp, /*rank0_only=*/false));
    out.optimizer[r] = bytes(opt.state_dict());
  }));
  return out;
}

// A fresh FSDP (another initialisation) loads every rank's shard; returns the same bytes.
// With `errors`, each rank's error lands there instead of failing the test.
Written read_set(const std::string& step_dir, int world, fsdp::ShardingStrategy strategy,
                 std::vector<std::string>* errors = nullptr) {
  manual_seed(12);
  auto start = nn::resnet_tiny(10, 4);
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (int r = 0; r < world; ++r) replicas.push_back(start->clone());
  Written out{std::vector<std::string>(world), std::vector<std::string>(world)};
  const std::vector<std::string> found = run_ranks(world, [&](std::shared_ptr<Communicator> comm) {
    const int r = comm->rank();
    fsdp::FullyShardedDataParallel fsdp(replicas[r], comm, {.sharding_strategy = strategy});
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
    safetensors::File file = ckpt::read_shard(step_dir, r, world);
    fsdp::check_sharded_compatible(fsdp, file.metadata, step_dir);
    fsdp::load_sharded_state_dict(fsdp, take(file.tensors, "model."));
    opt.load_state_dict(take(file.tensors, "optimizer."));
    out.model[r] = bytes(fsdp::full_state_dict(fsdp, /*rank0_only=*/false));
    out.optimizer[r] = bytes(opt.state_dict());
  });
  if (errors) *errors = found;
  else require_no_errors(found);
  return out;
}

}  // namespace

TEST_CASE("FSDP SHARDED_STATE_DICT: 2 and 3 ranks write a set; a fresh FSDP loads it back bit for bit") {
  TempDir dir("loom_dcp");
  for (int world : {2, 3}) {
    CAPTURE(world);
    const std::string step_dir = (dir.path / ("w" + std::to_string(world)) / ckpt::step_dir_name(2)).string();
    const Written written = write_set(step_dir, world, fsdp::ShardingStrategy::FULL_SHARD);
    CHECK(ckpt::why_incomplete(step_dir) == "");
    for (int r = 0; r < world; ++r) CHECK(fs::exists(step_dir + "/shard-" + std::to_string(r) + "-of-" +
                                                     std::to_string(world) + ".safetensors"));
    const ckpt::Manifest manifest = ckpt::read_manifest(step_dir);
    CHECK(manifest.world_size == world);
    CHECK(manifest.shards[1].bytes == static_cast<int64_t>(fs::file_size(step_dir + "/" + manifest.shards[1].file)));
    const Written read = read_set(step_dir, world, fsdp::ShardingStrategy::FULL_SHARD);
    for (int r = 0; r < world; ++r) {
      CHECK(read.model[r] == written.model[r]);          // parameters and this rank's buffers
      CHECK(read.optimizer[r] == written.optimizer[r]);  // momentum shards, hyperparameters
    }
  }
}

TEST_CASE("a sharded set loads only at its world size and strategy; the error says what came and what was expected") {
  TempDir dir("loom_dcp");
  const std::string step_dir = (dir.path / ckpt::step_dir_name(2)).string();
  write_set(step_dir, 2, fsdp::ShardingStrategy::FULL_SHARD);
  std::vector<std::string> errors;
  read_set(step_dir, 3, fsdp::ShardingStrategy::FULL_SHARD, &errors);
  for (const std::string& error : errors) {  // every rank, the same teaching error
    CHECK_MESSAGE(contains(error, "was written by 2 ranks, but this run has 3"), error);
    CHECK_MESSAGE(contains(error, "resharding is not supported"), error);
  }
  read_set(step_dir, 2, fsdp::ShardingStrategy::NO_SHARD, &errors);
  for (const std::string& error : errors) {
    CHECK_MESSAGE(contains(error, "sharding_strategy: the checkpoint has FULL_SHARD, this run has NO_SHARD"), error);
    CHECK_MESSAGE(contains(error, "shard_group_size: the checkpoint has 2, this run has 1"), error);
  }
}

namespace {

// A small complete set of `world` shards at `step` (no communication needed for files).
std::string write_fake_set(const fs::path& dir, int64_t step, int world) {
  const std::string step_dir = (dir / ckpt::step_dir_name(step)).string();
  for (int r = 0; r < world; ++r)
    ckpt::write_shard(step_dir, r, world, {{"x", full({16}, static_cast<double>(step * 10 + r))}});
  ckpt::write_manifest(step_dir, world);
  return step_dir;
}

}  // namespace

TEST_CASE("a half-written set is skipped by find_latest_complete, with the reason; the previous complete one is used") {
  struct Damage {
    const char* what;
    std::function<void(const std::string&)> apply;
    const char* reason;
  };
  const std::vector<Damage> damages = {
      {"no manifest", [](const std::string& d) { fs::remove(d + "/.metadata"); }, "no .metadata manifest"},
      {"a shard deleted", [](const std::string& d) { fs::remove(d + "/shard-1-of-2.safetensors"); },
       "shard-1-of-2.safetensors is missing"},
      {"a shard truncated", [](const std::string& d) { fs::resize_file(d + "/shard-0-of-2.safetensors", 40); },
       "shard-0-of-2.safetensors has 40 bytes, the manifest says"},
      {"a shard replaced", [](const std::string& d) {
         const std::string other = d + "/shard-0-of-2.safetensors";
         std::string bytes = read_whole_file(other, "test");
         bytes[bytes.size() - 1] ^= 1;  // same size, one bit flipped
         write_file_atomically(other, bytes, "test");
       }, "shard-0-of-2.safetensors has checksum"},
      {"a manifest that is not JSON", [](const std::string& d) { write_file_atomically(d + "/.metadata", "{", "t"); },
       "unreadable manifest"},
  };
  for (const Damage& damage : damages) {
    CAPTURE(std::string(damage.what));
    TempDir dir("loom_dcp");
    const std::string good = write_fake_set(dir.path, 4, 2);
    const std::string bad = write_fake_set(dir.path, 8, 2);
    REQUIRE(ckpt::find_latest_complete(dir.path.string()).step_dir == bad);  // intact: the newest wins
    damage.apply(bad);
    const ckpt::Latest latest = ckpt::find_latest_complete(dir.path.string());
    CHECK(latest.step_dir == good);
    CHECK(latest.global_step == 4);
    REQUIRE(latest.skipped.size() == 1);
    CHECK(latest.skipped[0].first == bad);
    CHECK_MESSAGE(latest.skipped[0].second.find(damage.reason) != std::string::npos, latest.skipped[0].second);
    CHECK(ckpt::describe_skipped(latest).find("step-00000008 (") == 0);
    CHECK(ckpt::read_shard(latest.step_dir, 1, 2).tensors.find("x")->tolist<float>()[0] == 41.0f);
  }
}

TEST_CASE("nothing complete: find_latest_complete says so; write_manifest refuses a set with a shard missing") {
  TempDir dir("loom_dcp");
  CHECK(ckpt::find_latest_complete(dir.path.string()).step_dir.empty());
  const std::string step_dir = (dir.path / ckpt::step_dir_name(3)).string();
  ckpt::write_shard(step_dir, 0, 2, {{"x", zeros({2})}});
  CHECK_THROWS_WITH_AS(ckpt::write_manifest(step_dir, 2), doctest::Contains("shard-1-of-2.safetensors is missing"),
                       Error);
  const ckpt::Latest latest = ckpt::find_latest_complete(dir.path.string());
  CHECK(latest.step_dir.empty());
  CHECK(latest.skipped.size() == 1);
  CHECK_THROWS_WITH_AS(ckpt::read_shard(step_dir, 0, 2), doctest::Contains("has no .metadata manifest"), Error);
}

TEST_CASE("remove_other_checkpoints keeps the new step and the newest complete one before it, nothing else") {
  TempDir dir("loom_dcp");
  write_fake_set(dir.path, 2, 2);
  const std::string fallback = write_fake_set(dir.path, 4, 2);
  const std::string broken = write_fake_set(dir.path, 6, 2);
  fs::remove(broken + "/.metadata");
  const std::string stale = write_fake_set(dir.path, 12, 2);  // a dead attempt's future
  const std::string current = write_fake_set(dir.path, 8, 2);
  ckpt::remove_other_checkpoints(dir.path.string(), current);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.path)) left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"step-00000004", "step-00000008"});
  CHECK(ckpt::remove_all_checkpoints(dir.path.string()) == 2);
}
