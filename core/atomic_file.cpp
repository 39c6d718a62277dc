#include "core/atomic_file.h"

#include <fcntl.h>   // defines: open, O_* flags
#include <unistd.h>  // defines: write, fsync, close, unlink, getpid

#include <cerrno>
#include <cstdio>    // defines: std::rename
#include <cstring>   // defines: std::strerror
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace loom {
namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& what) {
  // See Note [Atomic files].
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LOOM_CHECK(fd >= 0, what, ": cannot create '", tmp, "' to save '", path, "': ", errno_text(),
             " (does the directory exist and is it writable?)");
  auto fail = [&](const char* step) {
    std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    LOOM_FAIL(what, ": saving '", path, "' failed while ", step, " '", tmp, "': ", why);
  };
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing");
    written += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) fail("syncing");
  if (::close(fd) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    LOOM_FAIL(what, ": saving '", path, "' failed while closing '", tmp, "': ", why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    LOOM_FAIL(what, ": cannot rename '", tmp, "' to '", path, "': ", why);
  }
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  int dfd = ::open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_whole_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in, what, ": cannot open '", path, "': ", errno_text());
  std::ostringstream bytes;
  bytes << in.rdbuf();
  LOOM_CHECK(!in.bad(), what, ": error reading '", path, "': ", errno_text());
  return bytes.str();
}

}  // namespace loom
