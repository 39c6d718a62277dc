// loom::Error and the checking macros every layer uses.
//
// Errors teach: a message says what was expected, what came, and (when useful)
// what to try. LOOM_CHECK appends file:line so a report can be traced to code.
#pragma once

#include <sstream>    // defines: std::ostringstream, used to build messages
#include <stdexcept>  // defines: std::runtime_error, the base of loom::Error
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

// Concatenates any streamable arguments: str("expected ", a, " but got ", b).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace detail
}  // namespace loom

// LOOM_CHECK(cond, "expected ", x, " but got ", y) throws loom::Error when cond is false.
#define LOOM_CHECK(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      ::loom::detail::throw_error(__FILE__, __LINE__, ::loom::detail::str(__VA_ARGS__)); \
  } while (0)

#define LOOM_FAIL(...) ::loom::detail::throw_error(__FILE__, __LINE__, ::loom::detail::str(__VA_ARGS__))
