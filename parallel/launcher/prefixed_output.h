// Prefixed output: how loomrun labels each worker's lines, "[rank 3]: loss 0.52".
//
// Workers write into pipes; loomrun reads whatever bytes arrive and must not split or
// interleave lines, so a LinePrefixer holds the unfinished tail of a line until its
// newline comes (or the worker's stream ends).
#pragma once

#include <cstddef>
#include <string>

namespace loom::launcher {

class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix) : prefix_(std::move(prefix)) {}
  // The complete lines these bytes finish, each prefixed; possibly "".
  std::string feed(const char* data, size_t n);
  // At end of stream: the unfinished last line, prefixed and newline-terminated, or "".
  std::string finish();

 private:
  std::string prefix_;
  std::string partial_;
};

// Writes all of text to fd, retrying on EINTR and short writes. A reader that went
// away (EPIPE: loomrun's output closed) drops the text rather than failing the run.
void write_fully(int fd, const std::string& text);

}  // namespace loom::launcher
