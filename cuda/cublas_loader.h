// Internal to cuda/: cuBLAS, loaded with dlopen on first use rather than linked.
//
// Note [Why cuBLAS is loaded lazily]
// libcublas pulls in libcublasLt, and loading the two maps and relocates ~150 MiB: an
// empty program linked with -lcublas has 155 MB RSS, one linked with -lcudart, -lcudnn
// and -lnccl only 2-4 MB. Linked, that cost lands on every process that loads libloom
// -- CPU-only training, DDP workers on CPU, the tests, loomrun -- whether or not it
// ever runs a matmul on a GPU. So libloom does not link cuBLAS: the first CUDA matmul
// dlopen()s it and resolves exactly the functions loom calls (the table below) with
// dlsym. A process that never multiplies on a GPU never maps it; tests/test_cuda.cpp
// checks that through /proc/self/maps.
//
//   const CublasApi& api = cublas();  // loads on first call; a loom::Error if it cannot
//   LOOM_CUBLAS_CHECK(api.Create(&handle), "creating a cuBLAS handle");
//
// Adding a cuBLAS call means adding its pointer here and its dlsym in cublas_loader.cpp.
#pragma once

#ifndef LOOM_WITH_CUDA
#error "cuda/cublas_loader.h belongs to the CUDA backend"
#endif

#include <cublas_v2.h>  // declares the functions (their types only: nothing here links them)

namespace loom::cuda {

// cublasGemmStridedBatchedEx has an inline overload in cublas_api.h (the legacy
// cudaDataType compute type), so its pointer type is spelled out.
using CublasGemmStridedBatchedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                                        int, int, const void*, const void*, cudaDataType, int,
                                                        long long int, const void*, cudaDataType, int, long long int,
                                                        const void*, void*, cudaDataType, int, long long int, int,
                                                        cublasComputeType_t, cublasGemmAlgo_t);

// The cuBLAS functions loom uses; every pointer is non-null once cublas() returned.
struct CublasApi {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasGetStatusString) GetStatusString;
  CublasGemmStridedBatchedExFn GemmStridedBatchedEx;
};

// Loads libcublas on first call (thread-safe) and returns the table. Throws a loom::Error
// naming the library and dlerror() if it is missing or lacks a function.
const CublasApi& cublas();

// True once libcublas has been loaded by this process (for tests and diagnostics).
bool cublas_loaded();

}  // namespace loom::cuda
