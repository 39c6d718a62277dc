// Checked calls into NCCL, as cuda/check.h for CUDA:
//
//   LOOM_NCCL_CHECK(ncclAllReduce(...), comm, "all-reducing ", op.describe());
//
// and a failure throws loom::Error reading
//   NCCL error: unhandled system error (ncclSystemError) from ncclAllReduce(...) while
//   all-reducing all_reduce #3 (sum) of float32 [4] on rank 1 of 2. NCCL says: <its last
//   error>. <a hint> [parallel/comm/nccl_communicator.cpp:210]
//
// ncclInProgress is not a failure: the communicators here are non-blocking (Note [NCCL
// timeouts and the watchdog] in nccl_communicator.h), and the caller settles the call
// afterwards by polling ncclCommGetAsyncError.
#pragma once

#ifndef LOOM_WITH_NCCL
#error "parallel/comm/nccl_check.h belongs to the NCCL backend: only its sources (built with -DLOOM_WITH_NCCL) include it"
#endif

#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the nccl backend needs NCCL 2.14 or newer (non-blocking communicators, ncclGetLastError)"
#endif

#include <string>

#include "core/error.h"

namespace loom::distributed::nccl_detail {

inline const char* result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t";
  }
}

inline const char* hint(ncclResult_t result) {
  switch (result) {
    case ncclUnhandledCudaError: return "A CUDA call inside NCCL failed: check the device (nvidia-smi) and that "
                                        "each rank uses a different GPU";
    case ncclSystemError: return "A system call failed (sockets, shared memory, /dev/shm): set NCCL_DEBUG=WARN "
                                 "for details; in containers, enlarge /dev/shm";
    case ncclRemoteError: return "A peer failed or went away: check the other ranks' output for the first error";
    case ncclInvalidArgument:
    case ncclInvalidUsage: return "loom passed NCCL something it refuses: set NCCL_DEBUG=WARN and report it";
    default: return "Set NCCL_DEBUG=WARN for NCCL's own log";
  }
}

[[noreturn]] inline void throw_nccl_error(ncclResult_t result, ncclComm_t comm, const char* call,
                                          const std::string& what, const char* file, int line) {
  std::string message = ::loom::detail::str("NCCL error: ", ncclGetErrorString(result), " (", result_name(result),
                                            ") from ", call);
  if (!what.empty()) message += " while " + what;
  const char* last = ncclGetLastError(comm);  // may describe an earlier call; NCCL keeps only the last
  if (last != nullptr && *last != '\0') message += ::loom::detail::str(". NCCL says: ", last);
  message += ::loom::detail::str(". ", hint(result));
  ::loom::detail::throw_error(file, line, message);
}

}  // namespace loom::distributed::nccl_detail

#define LOOM_NCCL_CHECK(call, comm, ...)                                                                   \
  do {                                                                                                     \
    const ncclResult_t loom_nccl_result_ = (call);                                                         \
    if (loom_nccl_result_ != ncclSuccess && loom_nccl_result_ != ncclInProgress) [[unlikely]]              \
      ::loom::distributed::nccl_detail::throw_nccl_error(loom_nccl_result_, (comm), #call,                 \
                                                         std::string(__VA_OPT__(::loom::detail::str(__VA_ARGS__))), \
                                                         __FILE__, __LINE__);                              \
  } while (0)
