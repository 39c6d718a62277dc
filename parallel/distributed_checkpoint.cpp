#include "parallel/distributed_checkpoint.h"

#include <algorithm>
#include <cstdio>      // defines: std::snprintf
#include <filesystem>

#include "core/atomic_file.h"  // defines: write_file_atomically, read_whole_file
#include "core/error.h"
#include "nn/json.h"           // defines: json::parse, json::dump (the manifest)

namespace loom::distributed::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "loom-sharded-checkpoint";
constexpr const char* kStepPrefix = "step-";

// FNV-1a, 64 bits: a cheap checksum that catches a truncated, padded or swapped shard.
// Not a defence against deliberate tampering, which is not the threat here.
std::string fnv1a64(std::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string manifest_path(const std::string& step_dir) { return step_dir + "/" + kManifestName; }

// step-<N> directories under `dir`, newest first.
std::vector<std::pair<int64_t, std::string>> step_dirs(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind(kStepPrefix, 0) != 0) continue;
    const std::string digits = name.substr(std::string(kStepPrefix).size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    out.emplace_back(std::stoll(digits), entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

std::string step_dir_name(int64_t global_step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kStepPrefix, static_cast<long long>(global_step));
  return name;
}

std::string shard_file_name(int rank, int world_size) {
  return "shard-" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

void write_shard(const std::string& step_dir, int rank, int world_size, const OrderedDict<Tensor>& tensors,
                 const safetensors::Metadata& metadata) {
  LOOM_CHECK(rank >= 0 && rank < world_size, "checkpoint::write_shard: rank ", rank, " is outside a world of ",
             world_size);
  fs::create_directories(step_dir);
  safetensors::save_file(tensors, step_dir + "/" + shard_file_name(rank, world_size), metadata);  // atomic
}

void write_manifest(const std::string& step_dir, int world_size) {
  // See Note [The manifest is written last]: sizes and checksums as the shards are on disk now.
  json::Value::Array shards;
  for (int r = 0; r < world_size; ++r) {
    const std::string file = shard_file_name(r, world_size);
    const std::string path = step_dir + "/" + file;
    LOOM_CHECK(fs::is_regular_file(path), "checkpoint::write_manifest: ", path, " is missing; every rank must have "
               "written its shard (write_shard, then a barrier) before rank 0 writes the manifest");
    const std::string bytes = read_whole_file(path, "checkpoint::write_manifest");
    json::Value entry = json::Value::Object{};
    entry.set("file", file);
    entry.set("bytes", static_cast<int64_t>(bytes.size()));
    entry.set("fnv1a64", fnv1a64(bytes));
    shards.push_back(std::move(entry));
  }
  json::Value manifest = json::Value::Object{};
  manifest.set("format", kFormat);
  manifest.set("world_size", world_size);
  manifest.set("shards", std::move(shards));
  write_file_atomically(manifest_path(step_dir), json::dump(manifest) + "\n", "checkpoint::write_manifest");
}

void remove_manifest(const std::string& step_dir) {
  std::error_code error;
  fs::remove(manifest_path(step_dir), error);  // absent is fine
  LOOM_CHECK(!error, "checkpoint::remove_manifest: cannot remove ", manifest_path(step_dir), ": ", error.message());
}

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = manifest_path(step_dir);
  LOOM_CHECK(fs::is_regular_file(path), "sharded checkpoint ", step_dir, " has no ", kManifestName,
             " manifest: the save was interrupted before every shard was written, so it is incomplete");
  json::Value value;
  try {
    value = json::parse(read_whole_file(path, "sharded checkpoint"));
  } catch (const json::ParseError& e) {
    LOOM_FAIL("sharded checkpoint manifest ", path, " is not valid JSON: ", e.what());
  }
  const json::Value* format = value.is_object() ? value.find("format") : nullptr;
  LOOM_CHECK(format && format->is_string() && format->as_string() == kFormat, "sharded checkpoint manifest ", path,
             " does not say {\"format\": \"", kFormat, "\"}: it was not written by loom");
  Manifest manifest;
  manifest.world_size = static_cast<int>(value["world_size"].as_int());
  for (const json::Value& entry : value["shards"].as_array())
    manifest.shards.push_back({entry["file"].as_string(), entry["bytes"].as_int(), entry["fnv1a64"].as_string()});
  LOOM_CHECK(static_cast<int>(manifest.shards.size()) == manifest.world_size, "sharded checkpoint manifest ", path,
             " lists ", manifest.shards.size(), " shards for a world of ", manifest.world_size);
  return manifest;
}

std::string why_incomplete(const std::string& step_dir) {
  Manifest manifest;
  try {
    manifest = read_manifest(step_dir);
  } catch (const Error& e) {
    if (!fs::exists(manifest_path(step_dir)))
      return std::string("no ") + kManifestName + " manifest (the save was interrupted before every shard was written)";
    return std::string("unreadable manifest: ") + e.what();
  }
  for (const ShardEntry& shard : manifest.shards) {
    const std::string path = step_dir + "/" + shard.file;
    if (!fs::is_regular_file(path)) return shard.file + " is missing";
    const std::string bytes = read_whole_file(path, "sharded checkpoint");
    if (static_cast<int64_t>(bytes.size()) != shard.bytes)
      return shard.file + " has " + std::to_string(bytes.size()) + " bytes, the manifest says " +
             std::to_string(shard.bytes);
    if (fnv1a64(bytes) != shard.fnv1a64)
      return shard.file + " has checksum " + fnv1a64(bytes) + ", the manifest says " + shard.fnv1a64;
  }
  return "";
}

Latest find_latest_complete(const std::string& dir) {
  Latest latest;
  for (const auto& [step, path] : step_dirs(dir)) {
    std::string why = why_incomplete(path);
    if (why.empty()) {
      latest.step_dir = path;
      latest.global_step = step;
      break;
    }
    latest.skipped.emplace_back(path, std::move(why));
  }
  return latest;
}

std::string describe_skipped(const Latest& latest) {
  std::string out;
  for (const auto& [path, why] : latest.skipped)
    out += (out.empty() ? "" : "; ") + fs::path(path).filename().string() + " (" + why + ")";
  return out;
}

safetensors::File read_shard(const std::string& step_dir, int rank, int world_size) {
  const Manifest manifest = read_manifest(step_dir);
  // See Note [Same world, same layout].
  LOOM_CHECK(manifest.world_size == world_size, "sharded checkpoint ", step_dir, " was written by ",
             manifest.world_size, " ranks, but this run has ", world_size, ". Read rank by rank, a sharded checkpoint "
             "loads only at the world size that wrote it (resharding is not supported here; a set of pieces loads "
             "under any layout through parallel/checkpoint/load_plan.h): resume with ", manifest.world_size,
             " ranks, or write a full checkpoint (fsdp::full_state_dict), which loads at any world size");
  return safetensors::read_file(step_dir + "/" + manifest.shards[static_cast<size_t>(rank)].file);
}

void remove_other_checkpoints(const std::string& dir, const std::string& step_dir) {
  const std::string keep = fs::path(step_dir).filename().string();
  bool fallback_found = false, past_current = false;
  for (const auto& [step, path] : step_dirs(dir)) {  // newest first
    const std::string name = fs::path(path).filename().string();
    if (name == keep) {
      past_current = true;
      continue;
    }
    if (past_current && !fallback_found && why_incomplete(path).empty()) {
      fallback_found = true;  // the newest complete one before this step: kept
      continue;
    }
    std::error_code error;
    fs::remove_all(path, error);  // best effort: a checkpoint left behind is harmless
  }
}

int remove_all_checkpoints(const std::string& dir) {
  int removed = 0;
  for (const auto& [step, path] : step_dirs(dir)) {
    std::error_code error;
    if (fs::remove_all(path, error) > 0) ++removed;
  }
  return removed;
}

}  // namespace loom::distributed::checkpoint
