// LOOM_CHECK_ERRNO: the checked-call macro for POSIX calls (sockets, fork, poll, ...).
//
//   int fd = ::socket(AF_INET, SOCK_STREAM, 0);
//   LOOM_CHECK_ERRNO(fd >= 0, "socket() for the store server on port ", port);
//
// On failure it throws loom::Error with the caller's words, the system's own error
// string (strerror) and file:line, so a report names both what loom tried and what the
// kernel said. errno is read first thing, before building the message can clobber it.
#pragma once

#include <cerrno>    // defines: errno
#include <cstring>   // defines: std::strerror

#include "core/error.h"  // defines: loom::detail::throw_error, loom::detail::str

#define LOOM_CHECK_ERRNO(cond, ...)                                                               \
  do {                                                                                            \
    if (!(cond)) [[unlikely]] {                                                                   \
      const int loom_saved_errno = errno;                                                         \
      ::loom::detail::throw_error(__FILE__, __LINE__,                                             \
                                  ::loom::detail::str(__VA_ARGS__, ": ", std::strerror(loom_saved_errno), \
                                                      " (errno ", loom_saved_errno, ")"));        \
    }                                                                                             \
  } while (0)
