// cuBLAS through dlopen: see Note [Why cuBLAS is loaded lazily] in cuda/cublas_loader.h.
#include "cuda/cublas_loader.h"

#include <dlfcn.h>  // defines: dlopen, dlsym, dlerror

#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "cuda/check.h"  // declares: detail::cublas_status_string

namespace loom::cuda {
namespace {

// The shared object of the major version loom was compiled against: its ABI is the one
// the declarations above describe. It is found through libloom's RUNPATH (the CUDA
// library directories, cuda/meson.build), then the usual dlopen search.
#define LOOM_STRINGIFY_INNER(x) #x
#define LOOM_STRINGIFY(x) LOOM_STRINGIFY_INNER(x)
constexpr const char* kCublasLibrary = "libcublas.so." LOOM_STRINGIFY(CUBLAS_VER_MAJOR);

// The typedef must match the real function; checked in an unevaluated context, so
// nothing here refers to (and links) the symbol itself.
static_assert(std::is_same_v<decltype(static_cast<CublasGemmStridedBatchedExFn>(&cublasGemmStridedBatchedEx)),
                             CublasGemmStridedBatchedExFn>);

std::atomic<bool> g_loaded{false};

template <typename Fn>
void resolve(void* library, Fn& slot, const char* symbol) {
  dlerror();  // clear any earlier error
  void* address = dlsym(library, symbol);
  if (address == nullptr) {
    const char* why = dlerror();
    LOOM_FAIL("cuBLAS: ", kCublasLibrary, " has no function '", symbol, "' (", why ? why : "null symbol",
              "); loom was compiled against cuBLAS ", CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR,
              " -- install a matching CUDA toolkit or point LD_LIBRARY_PATH at one");
  }
  slot = reinterpret_cast<Fn>(address);
}

CublasApi load() {
  // RTLD_LOCAL: the symbols stay private to this handle (nothing else links them);
  // never dlclose()d, since handles created from it live until exit (cuda/handle_pool.h).
  void* library = dlopen(kCublasLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    LOOM_FAIL("cuBLAS: cannot load ", kCublasLibrary, " (", why ? why : "unknown reason",
              "), needed for matmul on CUDA; install the CUDA toolkit's cuBLAS or add its lib64 directory to "
              "LD_LIBRARY_PATH");
  }
  CublasApi api{};
  // Names after cublas_v2.h's macros (cublasCreate -> cublasCreate_v2, ...).
  resolve(library, api.Create, "cublasCreate_v2");
  resolve(library, api.SetStream, "cublasSetStream_v2");
  resolve(library, api.SetWorkspace, "cublasSetWorkspace_v2");
  resolve(library, api.SetMathMode, "cublasSetMathMode");
  resolve(library, api.GetStatusString, "cublasGetStatusString");
  resolve(library, api.GemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
  return api;
}

}  // namespace

const CublasApi& cublas() {
  // A throw leaves the flag unset, so the next call tries (and explains) again.
  static std::once_flag once;
  static CublasApi api;
  std::call_once(once, [] {
    api = load();
    g_loaded.store(true, std::memory_order_release);
  });
  return api;
}

bool cublas_loaded() { return g_loaded.load(std::memory_order_acquire); }

namespace detail {
// LOOM_CUBLAS_CHECK's error string. A status exists only after a cuBLAS call, i.e. once
// the library is loaded.
const char* cublas_status_string(int status) {
  return cublas_loaded() ? cublas().GetStatusString(static_cast<cublasStatus_t>(status)) : "cuBLAS not loaded";
}
}  // namespace detail

}  // namespace loom::cuda
