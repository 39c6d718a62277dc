// The checks of a path flag, made with the flag table's other rules, before anything runs:
//
//   check_input_file("--init", config.model.init);            // exists, a file, readable
//   check_output_file("--save", config.checkpoint.save);      // its folder exists and takes files
//   check_output_folder("--checkpoint-dir", config.checkpoint.dir);  // a folder, or one that can be made
//
// "" (the flag not given) passes. Each failure is a loom::Error naming the flag, the path,
// what was expected and what is there: "--checkpoint-dir ckpt: is a file; expected a folder".
//
// Note [Path flags are checked first]
// A path is checked where the flags are, before the data is read or the model built: a
// --save into a missing folder would otherwise fail after the whole run, and a
// --checkpoint-dir naming a file at the first checkpoint, as a filesystem_error that names
// no flag. Whether a folder takes new files is
// access(2)'s answer for this process (W_OK | X_OK), the kernel's own rule: a read-only
// mount answers EROFS for everyone, and root passes the permission bits, as it would when
// writing. An output folder that does not exist yet is made on the first write (with its
// parents, as torch.distributed.checkpoint's FileSystemWriter does), so the nearest folder
// above it that exists must take new entries; an output file's own folder must exist
// (torch.save, too, refuses a missing one).
#pragma once

#include <string>

namespace loom::training {

// A file the program reads: it exists, is not a folder, and is readable.
void check_input_file(const std::string& flag, const std::string& path);
// A file the program writes (replacing it if there): not a folder; its folder exists and
// takes new files.
void check_output_file(const std::string& flag, const std::string& path);
// A folder the program writes into, made if missing: not a file; it, or the nearest
// existing folder above it, takes new entries.
void check_output_folder(const std::string& flag, const std::string& path);

}  // namespace loom::training
