#include "train/path_flags.h"

#include <unistd.h>  // defines: access

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace loom::training {
namespace fs = std::filesystem;

namespace {

// Whether `folder` takes new entries (Note [Path flags are checked first]); else why not.
std::string why_not_writable(const fs::path& folder) {
  if (::access(folder.c_str(), W_OK | X_OK) == 0) return "";
  return std::strerror(errno);
}

// `path`'s folder as a path that names it ("." for a bare name).
fs::path folder_of(const fs::path& path) {
  const fs::path parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

}  // namespace

void check_input_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  LOOM_CHECK(fs::exists(status), flag, " ", path, ": no such file");
  LOOM_CHECK(!fs::is_directory(status), flag, " ", path, ": is a folder; expected a file");
  LOOM_CHECK(::access(path.c_str(), R_OK) == 0, flag, " ", path, ": cannot be read: ", std::strerror(errno));
}

void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code error;
  LOOM_CHECK(!fs::is_directory(path, error), flag, " ", path, ": is a folder; expected a file to write");
  const fs::path folder = folder_of(path);
  const fs::file_status status = fs::status(folder, error);
  LOOM_CHECK(fs::exists(status), flag, " ", path, ": its folder ", folder.string(), " does not exist; create it first");
  LOOM_CHECK(fs::is_directory(status), flag, " ", path, ": ", folder.string(), " is a file, not a folder");
  const std::string why = why_not_writable(folder);
  LOOM_CHECK(why.empty(), flag, " ", path, ": cannot write into its folder ", folder.string(), ": ", why);
}

void check_output_folder(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (fs::exists(status)) {
    LOOM_CHECK(fs::is_directory(status), flag, " ", path, ": is a file; expected a folder (made if missing)");
    const std::string why = why_not_writable(path);
    LOOM_CHECK(why.empty(), flag, " ", path, ": cannot write into it: ", why);
    return;
  }
  // Made on the first write, with its parents: the nearest existing folder above must take them.
  fs::path above = folder_of(path);
  for (fs::path next = folder_of(above); !fs::exists(above, error) && next != above; next = folder_of(above))
    above = next;
  LOOM_CHECK(fs::is_directory(above, error), flag, " ", path, ": cannot be made, ", above.string(),
             " is a file, not a folder");
  const std::string why = why_not_writable(above);
  LOOM_CHECK(why.empty(), flag, " ", path, ": cannot be made in ", above.string(), ": ", why);
}

}  // namespace loom::training
