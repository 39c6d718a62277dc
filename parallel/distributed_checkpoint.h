// A sharded checkpoint on disk: every rank writes its own file, rank 0 writes a manifest
// last, and only a set the manifest vouches for is ever loaded. PyTorch's
// torch.distributed.checkpoint layout (each rank's shard, then a ".metadata" file from the
// coordinator), for state that no single rank holds whole: FSDP's flat-parameter shards,
// ZeRO's optimizer partitions (parallel/fsdp/sharded_state_dict.h,
// parallel/zero_redundancy_optimizer.h).
//
//   <dir>/step-00000012/shard-0-of-2.safetensors   rank 0's tensors and metadata
//   <dir>/step-00000012/shard-1-of-2.safetensors   rank 1's
//   <dir>/step-00000012/.metadata                  the manifest: JSON, written last
//
//   // every rank:
//   checkpoint::write_shard(step_dir, rank, world, tensors, metadata);
//   barrier();                                       // every shard is on disk
//   if (rank == 0) checkpoint::write_manifest(step_dir, world);
//   // later, after a restart:
//   checkpoint::Latest latest = checkpoint::find_latest_complete(dir);
//   safetensors::File mine = checkpoint::read_shard(latest.step_dir, rank, world);
//
// Note [The manifest is written last]
// A rank killed while saving leaves some shards of the new step and not others, or a
// shard cut short by a full disk or a copy. Every file is written atomically (Note
// [Atomic files]), but atomic files alone do not make the *set* atomic: that is the
// manifest's job. Rank 0 writes it only after a barrier has seen every rank's shard
// renamed into place, and it records each shard's size and FNV-1a checksum as found on
// disk. A step directory is complete when its manifest exists, parses, names `world`
// shards, and every one of them is there with that size and checksum; anything else is
// incomplete and is never loaded -- auto-resume falls back to the newest complete step
// and says which ones it skipped and why. Written first, the manifest would vouch for
// shards that may never arrive (the mutation check in tests/test_distributed_checkpoint.cpp).
//
// Note [Same world, same layout]
// read_shard hands a rank its own file of the set, which only means something in the cut
// that wrote it: it refuses a different world size, naming both, and the owners of such
// shards check the rest (fsdp::check_sharded_compatible). A set whose files describe each
// piece by name, global shape and offsets (Note [Saved pieces], parallel/checkpoint/
// sharded_state.h) loads under any other world and layout instead: every rank indexes all
// the files and plans its reads (parallel/checkpoint/load_plan.h). train_cifar10 writes those.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/safetensors.h"  // defines: safetensors::File, Metadata

namespace loom::distributed::checkpoint {

inline constexpr const char* kManifestName = ".metadata";  // torch.distributed.checkpoint's name

// "step-00000012": zero-padded, so that names sort as steps do.
std::string step_dir_name(int64_t global_step);
// "shard-1-of-2.safetensors"
std::string shard_file_name(int rank, int world_size);

// This rank's shard, atomically (the directory is created if needed). Not collective.
void write_shard(const std::string& step_dir, int rank, int world_size, const OrderedDict<Tensor>& tensors,
                 const safetensors::Metadata& metadata = {});

// Rank 0, after a barrier that follows every rank's write_shard: reads back every shard's
// size and checksum and writes the manifest atomically. A missing shard is an error here
// (the barrier should have made it impossible). See Note [The manifest is written last].
void write_manifest(const std::string& step_dir, int world_size);

// Rank 0, before the shards of a step directory that may already hold a set are written
// again: without its manifest the directory is incomplete until write_manifest.
void remove_manifest(const std::string& step_dir);

struct ShardEntry {
  std::string file;  // relative to the step directory
  int64_t bytes = 0;
  std::string fnv1a64;  // 16 hex digits
};
struct Manifest {
  int world_size = 0;
  std::vector<ShardEntry> shards;
};
// The parsed manifest; a loom::Error naming the file when it is missing or malformed.
Manifest read_manifest(const std::string& step_dir);

// "" when `step_dir` is complete, else why not ("no .metadata manifest (the save was
// interrupted before every shard was written)", "shard-1-of-2.safetensors has 100 bytes,
// the manifest says 4096", ...). Reads and checksums every shard.
std::string why_incomplete(const std::string& step_dir);

struct Latest {
  std::string step_dir;  // the newest complete step directory; "" when there is none
  int64_t global_step = -1;
  std::vector<std::pair<std::string, std::string>> skipped;  // newer, incomplete ones: (dir, why)
};
// Looks at <dir>/step-* from the newest down and stops at the first complete one.
Latest find_latest_complete(const std::string& dir);
// "step-00000016 (no .metadata manifest ...); step-00000014 (...)", for log lines.
std::string describe_skipped(const Latest& latest);

// This rank's shard of a complete step directory. A loom::Error when the manifest was
// written by another world size (Note [Same world, same layout]) or is missing.
safetensors::File read_shard(const std::string& step_dir, int rank, int world_size);

// Rank 0, right after the manifest of `step_dir`: keeps it and the newest complete step
// before it (the fallback should it be damaged later), removes every other step
// directory, including newer ones: those belong to an attempt that died after the
// checkpoint this run resumed from, and must not be mistaken for its future.
void remove_other_checkpoints(const std::string& dir, const std::string& step_dir);
// Every step directory under `dir` (a first start clears an earlier run's; see Note
// [Resuming after a restart] in train/checkpoint.h). Returns how many.
int remove_all_checkpoints(const std::string& dir);

}  // namespace loom::distributed::checkpoint
