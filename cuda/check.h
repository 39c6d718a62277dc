// Checked calls into CUDA, cuBLAS and cuDNN: every call in cuda/ goes through one of
//
//   LOOM_CUDA_CHECK(cudaMemcpyAsync(...), "copying ", n, " bytes from cuda:0 to cpu");
//   LOOM_CUBLAS_CHECK(cublasSgemm(...), "mm ", shape_a, " @ ", shape_b);
//   LOOM_CUDNN_CHECK(cudnnConvolutionForward(...), "conv2d forward");
//   LOOM_CUDA_CHECK_LAUNCH("binary op");         // after a <<<...>>> launch
//
// and a failure throws loom::Error reading
//   CUDA error: out of memory (cudaErrorMemoryAllocation) from cudaMalloc(&ptr, size)
//   while allocating 2097152 bytes on cuda:0 [cuda/caching_allocator.cpp:210]
// i.e. the library's own error string, the call, what loom was doing, file:line.
//
// The trailing arguments are streamed (as LOOM_CHECK's), and only evaluated on failure.
// The cuBLAS and cuDNN macros name their libraries' types but this header does not
// include their headers: a file using LOOM_CUBLAS_CHECK includes <cublas_v2.h> itself.
// cuBLAS is dlopen()ed (Note [Why cuBLAS is loaded lazily], cuda/cublas_loader.h), so its
// status string comes through the loader, not a direct call.
#pragma once

#ifndef LOOM_WITH_CUDA
#error "cuda/check.h belongs to the CUDA backend: only cuda/ sources (built with -DLOOM_WITH_CUDA) include it"
#endif

#include <cuda_runtime_api.h>  // defines: cudaError_t, cudaGetErrorString, cudaGetErrorName

#include <string>

#include "core/error.h"  // defines: loom::Error, loom::detail::str

namespace loom::cuda::detail {

// Builds the message above and throws loom::Error. `library` is "CUDA", "cuBLAS", ...;
// `what` may be empty.
[[noreturn]] inline void throw_library_error(const char* library, const char* error, const char* call,
                                             const std::string& what, const char* file, int line) {
  std::string message = ::loom::detail::str(library, " error: ", error, " from ", call);
  if (!what.empty()) message += " while " + what;
  ::loom::detail::throw_error(file, line, message);
}

// cublasGetStatusString through the lazily loaded library (cuda/cublas_loader.cpp).
const char* cublas_status_string(int status);

inline std::string cuda_error_string(cudaError_t error) {
  return ::loom::detail::str(cudaGetErrorString(error), " (", cudaGetErrorName(error), ")");
}

}  // namespace loom::cuda::detail

#define LOOM_CUDA_CHECK(call, ...)                                                                          \
  do {                                                                                                      \
    const cudaError_t loom_cuda_error_ = (call);                                                            \
    if (loom_cuda_error_ != cudaSuccess) [[unlikely]] {                                                     \
      (void)cudaGetLastError(); /* clear a non-sticky error so the next call does not report it again */ \
      ::loom::cuda::detail::throw_library_error("CUDA",                                                     \
                                                ::loom::cuda::detail::cuda_error_string(loom_cuda_error_).c_str(), \
                                                #call, std::string(__VA_OPT__(::loom::detail::str(__VA_ARGS__))), __FILE__, __LINE__); \
    }                                                                                                       \
  } while (0)

// Kernel launches report configuration errors through cudaGetLastError; errors during
// execution surface at the next synchronising call.
#define LOOM_CUDA_CHECK_LAUNCH(name) LOOM_CUDA_CHECK(cudaGetLastError(), "launching the ", name, " kernel")

#define LOOM_CUBLAS_CHECK(call, ...)                                                                        \
  do {                                                                                                      \
    const cublasStatus_t loom_cublas_status_ = (call);                                                      \
    if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                          \
      ::loom::cuda::detail::throw_library_error("cuBLAS", ::loom::cuda::detail::cublas_status_string(loom_cublas_status_), #call, \
                                                std::string(__VA_OPT__(::loom::detail::str(__VA_ARGS__))), __FILE__, __LINE__);      \
  } while (0)

#define LOOM_CUDNN_CHECK(call, ...)                                                                         \
  do {                                                                                                      \
    const cudnnStatus_t loom_cudnn_status_ = (call);                                                        \
    if (loom_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                            \
      ::loom::cuda::detail::throw_library_error("cuDNN", cudnnGetErrorString(loom_cudnn_status_), #call,    \
                                                std::string(__VA_OPT__(::loom::detail::str(__VA_ARGS__))), __FILE__, __LINE__);      \
  } while (0)
