#include "parallel/launcher/prefixed_output.h"

#include <unistd.h>

#include <cerrno>

#include "parallel/system_error.h"  // defines: LOOM_CHECK_ERRNO

namespace loom::launcher {

std::string LinePrefixer::feed(const char* data, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    partial_.push_back(data[i]);
    if (data[i] == '\n') {
      out += prefix_;
      out += partial_;
      partial_.clear();
    }
  }
  return out;
}

std::string LinePrefixer::finish() {
  if (partial_.empty()) return "";
  std::string out = prefix_ + partial_ + "\n";
  partial_.clear();
  return out;
}

void write_fully(int fd, const std::string& text) {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EPIPE) return;
    LOOM_CHECK_ERRNO(n >= 0, "loomrun: writing worker output to fd ", fd);
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace loom::launcher
