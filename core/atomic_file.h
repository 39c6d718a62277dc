// write_file_atomically: a file appears whole or not at all.
//
//   write_file_atomically("ckpt/model.safetensors", bytes, "safetensors");
//
// Note [Atomic files]
// The bytes go to "<path>.tmp.<pid>", are fsync'ed and closed, and the temporary is
// renamed over <path>; then the directory is synced so the rename itself survives a
// power cut (best effort: some filesystems refuse to sync a directory). A reader sees the
// previous file or the new one, never a prefix: a process killed mid-write (or a full
// disk) leaves only a *.tmp.<pid> that no reader looks for. Checkpoints, their manifests,
// metrics and traces are all written this way; the sharded checkpoint's manifest relies
// on it (parallel/distributed_checkpoint.h: Note [The manifest is written last]).
#pragma once

#include <string>
#include <string_view>

namespace loom {

// `what` names the writer in errors ("safetensors", "--metrics-json"). A loom::Error
// naming the path, the step that failed and the system's reason; the temporary is removed.
void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& what);

// The whole file as bytes; a loom::Error naming `what` and the path if it cannot be read.
std::string read_whole_file(const std::string& path, const std::string& what);

}  // namespace loom
