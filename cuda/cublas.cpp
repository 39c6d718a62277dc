// mm_kernel and bmm_kernel on CUDA, through cuBLAS.
//
// Note [Row-major matmul on column-major cuBLAS]
// cuBLAS reads matrices column-major; loom's are row-major. A row-major [r, c] matrix
// with row stride ld *is* the column-major [c, r] matrix X^T with leading dimension
// ld, so no data moves: C = A @ B is computed as C^T = B^T @ A^T, i.e. cuBLAS is called
// with the operands swapped (B first) and m = N, n = M. A transposed view (unit stride
// along rows instead of columns) is column-major already: it is passed with op T.
// Only a matrix with no unit stride at all (or an expanded one) is copied first.
//
// One call serves every case: cublasGemmStridedBatchedEx with batch 1 for mm, the
// batch dim's stride otherwise; float32 accumulates in float32 (or TF32 when allowed:
// see cuda/backends.h), float64 in float64, float16/bfloat16 in float32.
//
// cuBLAS is not linked: every call goes through the table of cuda/cublas_loader.h
// (Note [Why cuBLAS is loaded lazily]), loaded by the first matmul.
#include "cuda/backends.h"  // declares: set_allow_tf32

#include <atomic>
#include <climits>

#include "core/kernels.h"
#include "cuda/check.h"   // defines: LOOM_CUBLAS_CHECK
#include "cuda/copy.h"    // defines: contiguous_on_device, copy_on_device
#include "cuda/cublas_loader.h"  // defines: cublas() (the dlopen()ed functions)
#include "cuda/device.h"  // defines: DeviceGuard, current_stream
#include "cuda/handle_pool.h"  // defines: HandlePool, HandleLease

namespace loom::cuda {
namespace {

std::atomic<bool> g_allow_tf32{false};

HandlePool<cublasHandle_t>& cublas_handles() {
  static auto* pool = new HandlePool<cublasHandle_t>([](int device) {  // leaked: see cuda/handle_pool.h
    cublasHandle_t handle = nullptr;
    LOOM_CUBLAS_CHECK(cublas().Create(&handle), "creating a cuBLAS handle on cuda:", device);
    return handle;
  });
  return *pool;
}

// The last two dims of a [batch, r, c] tensor as cuBLAS sees them: see Note [Row-major
// matmul on column-major cuBLAS]. `op` applied to the column-major matrix at `ptr`
// yields X^T.
struct Operand {
  Tensor storage;  // keeps a packed copy alive
  cublasOperation_t op;
  int64_t ld;
  int64_t batch_stride;
};

Operand describe(const Tensor& x3) {
  const int64_t r = x3.size(1), c = x3.size(2), sr = x3.stride(1), sc = x3.stride(2);
  const int64_t batch_stride = x3.size(0) == 1 ? 0 : x3.stride(0);
  if ((sc == 1 || c == 1) && (r == 1 || sr >= std::max<int64_t>(1, c)))
    return {x3, CUBLAS_OP_N, r == 1 ? std::max<int64_t>(1, c) : sr, batch_stride};
  if ((sr == 1 || r == 1) && (c == 1 || sc >= std::max<int64_t>(1, r)))
    return {x3, CUBLAS_OP_T, c == 1 ? std::max<int64_t>(1, r) : sc, batch_stride};
  Tensor packed = contiguous_on_device(x3);
  return {packed, CUBLAS_OP_N, std::max<int64_t>(1, c), x3.size(0) == 1 ? 0 : r * c};
}

cudaDataType cuda_type(DType dtype) {
  switch (dtype) {
    case kFloat32: return CUDA_R_32F;
    case kFloat64: return CUDA_R_64F;
    case kFloat16: return CUDA_R_16F;
    case kBFloat16: return CUDA_R_16BF;
    default: LOOM_FAIL("matmul on CUDA: dtype ", dtype, " is not supported (float32, float64, float16, bfloat16)");
  }
}

int to_int(int64_t value, const char* what) {
  LOOM_CHECK(value <= INT_MAX, "matmul on CUDA: ", what, " = ", value, " exceeds cuBLAS's 32-bit limit");
  return static_cast<int>(value);
}

// out[b] = beta * out[b] + a[b] @ b[b] for 3-d tensors [B, M, K] @ [B, K, N].
void gemm(const Tensor& a, const Tensor& b, double beta, Tensor& out) {
  LOOM_CHECK(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "matmul on CUDA: dtypes differ: ", a.dtype(), " @ ",
             b.dtype(), " -> ", out.dtype());
  const int64_t batch = out.size(0), M = out.size(1), N = out.size(2), K = a.size(2);
  if (batch == 0 || M == 0 || N == 0) return;
  const int device = out.device().index;
  DeviceGuard guard(device);

  // The output must be row-major with unit column stride; otherwise compute into a
  // packed temporary (holding out's values when beta = 1) and copy back.
  const bool out_ok = (out.stride(2) == 1 || N == 1) && (M == 1 || out.stride(1) >= N) &&
                      (batch == 1 || out.stride(0) >= M * N);
  Tensor result = out_ok ? out : contiguous_on_device(out);
  const int64_t ldc = M == 1 ? N : result.stride(1);
  const int64_t stride_c = batch == 1 ? 0 : result.stride(0);

  const Operand A = describe(a), B = describe(b);
  const DType dtype = out.dtype();
  const cudaDataType type = cuda_type(dtype);
  const bool tf32 = dtype == kFloat32 && g_allow_tf32.load(std::memory_order_relaxed);
  const cublasComputeType_t compute = dtype == kFloat64 ? CUBLAS_COMPUTE_64F
                                      : tf32            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                        : CUBLAS_COMPUTE_32F;
  const double alpha64 = 1.0, beta64 = beta;
  const float alpha32 = 1.0f, beta32 = static_cast<float>(beta);
  const void* alpha = dtype == kFloat64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta_ptr = dtype == kFloat64 ? static_cast<const void*>(&beta64) : &beta32;

  HandleLease<cublasHandle_t> lease(cublas_handles(), device);
  LOOM_CUBLAS_CHECK(cublas().SetStream(lease.handle, current_stream(device).handle), "binding cuBLAS to loom's stream");
  // Note [A cuBLAS workspace per call]: a leased handle may have served another stream
  // a moment ago, whose kernel may still be using the handle's own workspace. So each
  // call brings one from the caching allocator, on this stream: the next call on this
  // stream reuses the block in stream order, a call on another stream gets another.
  // 32 MiB as PyTorch gives cuBLAS on Hopper (CUBLAS_WORKSPACE_CONFIG :4096:8).
  constexpr int64_t kWorkspaceBytes = int64_t(32) << 20;
  Tensor workspace = empty({kWorkspaceBytes}, TensorOptions(kUInt8).device(out.device()));
  LOOM_CUBLAS_CHECK(cublas().SetWorkspace(lease.handle, workspace.raw_data(), static_cast<size_t>(kWorkspaceBytes)),
                    "giving cuBLAS its workspace");
  LOOM_CUBLAS_CHECK(cublas().SetMathMode(lease.handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                    "setting cuBLAS's math mode");
  // C^T = B^T A^T: B's operand first, m = N, n = M.
  LOOM_CUBLAS_CHECK(cublas().GemmStridedBatchedEx(lease.handle, B.op, A.op, to_int(N, "N"), to_int(M, "M"), to_int(K, "K"),
                                               alpha, B.storage.raw_data(), type, to_int(B.ld, "ldb"), B.batch_stride,
                                               A.storage.raw_data(), type, to_int(A.ld, "lda"), A.batch_stride, beta_ptr,
                                               result.raw_data(), type, to_int(ldc, "ldc"), stride_c, to_int(batch, "batch"),
                                               compute, CUBLAS_GEMM_DEFAULT),
                    "computing ", a.shape(), " @ ", b.shape(), " (", dtype, ") on ", out.device());
  if (!result.is_same(out)) copy_on_device(result, out);
}

// A [r, c] matrix as a batch of one [1, r, c], same memory.
Tensor as_batch(const Tensor& t) {
  return make_tensor(t.storage(), {1, t.size(0), t.size(1)}, {t.size(0) * t.size(1), t.stride(0), t.stride(1)},
                     t.storage_offset(), t.dtype());
}

void mm_cuda(const Tensor& a, const Tensor& b, double beta, Tensor& out) {
  Tensor out3 = as_batch(out);
  gemm(as_batch(a), as_batch(b), beta, out3);
}

void bmm_cuda(const Tensor& a, const Tensor& b, Tensor& out) { gemm(a, b, 0.0, out); }

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

LOOM_REGISTER_KERNEL(mm_kernel, DeviceType::CUDA, mm_cuda);
LOOM_REGISTER_KERNEL(bmm_kernel, DeviceType::CUDA, bmm_cuda);

}  // namespace loom::cuda
