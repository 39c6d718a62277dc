// CPU matrix multiplication: mm and bmm on OpenBLAS's gemm (float32 and float64).
//
// Note [BLAS operand layout]
// gemm reads each matrix as (pointer, leading dimension, transpose flag). A row-major
// view [R, C] has unit column stride and a row stride ld >= C: it is passed as is
// (CblasNoTrans, lda = row stride). A transposed view (x.t(), weight.t() in linear,
// a.transpose(1, 2) in bmm's backward) has unit *row* stride: it is the row-major [C, R]
// matrix it was made from, passed with CblasTrans and lda = its column stride. So every
// view with one unit stride multiplies without a copy. Anything else (a strided slice,
// an expanded operand with stride 0) is made contiguous by the caller
// (autograd/ops/linalg.cpp), so that every backend sees only these two cases; this file
// checks and explains when a caller forgot. Size-1 dims have meaningless strides, so
// they never decide the layout.
//
// Note [BLAS threads]
// Debian's libopenblas-openmp is built with OpenMP and shares loom's OpenMP thread pool:
// a gemm called outside any parallel region runs on OMP_NUM_THREADS threads, and one
// called inside an active OpenMP parallel region runs single-threaded. That is what keeps
// bmm from oversubscribing the cores: it either parallelises over the batch (each gemm
// then runs on one thread) or calls gemm serially and lets BLAS use every thread, never
// both.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>

#include "core/cpu/float32_staging.h"  // defines: float32_copy (Note [16-bit CPU kernels stage through float32])
#include "core/kernels.h"

namespace loom::cpu {
namespace {

// Below this many multiply-adds per matrix, BLAS's own threading costs more than it
// saves, so bmm spreads the batch over threads even when the batch is small.
constexpr int64_t kSmallGemm = 64 * 64 * 64;

// How gemm reads one matrix operand: see Note [BLAS operand layout].
struct Operand {
  CBLAS_TRANSPOSE trans;
  blasint ld;
};

blasint to_blas_int(int64_t value, const char* op) {
  LOOM_CHECK(value <= INT_MAX, op, ": dimension or stride ", value, " exceeds what this BLAS can index (", INT_MAX,
             "); OpenBLAS was built with 32-bit integers");
  return static_cast<blasint>(value);
}

// The layout of a rows x cols matrix with the given strides, or an error naming them.
Operand operand_layout(const char* op, const char* which, int64_t rows, int64_t cols, int64_t row_stride,
                       int64_t col_stride) {
  const int64_t min_row_ld = std::max<int64_t>(cols, 1);
  if (cols <= 1 || col_stride == 1) {  // row-major
    int64_t ld = rows <= 1 ? min_row_ld : row_stride;
    if (ld >= min_row_ld) return {CblasNoTrans, to_blas_int(ld, op)};
  }
  const int64_t min_col_ld = std::max<int64_t>(rows, 1);
  if (rows <= 1 || row_stride == 1) {  // the transpose of a row-major matrix
    int64_t ld = cols <= 1 ? min_col_ld : col_stride;
    if (ld >= min_col_ld) return {CblasTrans, to_blas_int(ld, op)};
  }
  LOOM_FAIL(op, ": ", which, " (", rows, "x", cols, ", strides [", row_stride, ", ", col_stride,
            "]) needs a unit stride in one dimension to be read by BLAS; the caller must pass it .contiguous()");
}

void gemm(const Operand& a, const Operand& b, blasint m, blasint n, blasint k, const float* pa, const float* pb,
          float beta, float* pc, blasint ldc) {
  cblas_sgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0f, pa, a.ld, pb, b.ld, beta, pc, ldc);
}

void gemm(const Operand& a, const Operand& b, blasint m, blasint n, blasint k, const double* pa, const double* pb,
          double beta, double* pc, blasint ldc) {
  cblas_dgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0, pa, a.ld, pb, b.ld, beta, pc, ldc);
}

// out must be row-major: gemm writes C through one leading dimension.
blasint out_leading_dim(const char* op, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  Operand layout = operand_layout(op, "the output", rows, cols, row_stride, col_stride);
  LOOM_CHECK(layout.trans == CblasNoTrans || (rows <= 1 && cols <= 1), op, ": the output (", rows, "x", cols,
             ", strides [", row_stride, ", ", col_stride, "]) must be row-major");
  return layout.ld;
}

// K == 0: the product is a zero matrix, so out = beta * out (beta is 0 or 1). BLAS
// implementations disagree on whether they touch C in this case; loom does not ask.
template <typename T>
void empty_product(T* out, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, double beta) {
  if (beta == 1.0) return;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * row_stride + j * col_stride] = T(0);
}

void mm_cpu(const Tensor& a, const Tensor& b, double beta, Tensor& out) {
  LOOM_CHECK(beta == 0.0 || beta == 1.0, "mm: beta must be 0 or 1, got ", beta);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  if (cpu::is_16bit_float(a.dtype())) {  // See Note [16-bit CPU kernels stage through float32]
    Tensor out32 = beta == 0.0 ? cpu::float32_like(out) : cpu::float32_copy(out);
    mm_cpu(cpu::float32_copy(a), cpu::float32_copy(b), beta, out32);
    return cpu::round_into(out32, out);
  }
  dispatch_floating(a.dtype(), "mm", [&]<typename T>() {
    T* pc = out.data_ptr<T>();
    if (k == 0) return empty_product(pc, m, n, out.stride(0), out.stride(1), beta);
    Operand la = operand_layout("mm", "the first operand", m, k, a.stride(0), a.stride(1));
    Operand lb = operand_layout("mm", "the second operand", k, n, b.stride(0), b.stride(1));
    blasint ldc = out_leading_dim("mm", m, n, out.stride(0), out.stride(1));
    gemm(la, lb, to_blas_int(m, "mm"), to_blas_int(n, "mm"), to_blas_int(k, "mm"), a.data_ptr<T>(), b.data_ptr<T>(),
         static_cast<T>(beta), pc, ldc);
  });
}

// Batch matrices may sit at any batch stride, including 0 (one matrix broadcast over
// the batch); within a matrix, Note [BLAS operand layout] applies.
void bmm_cpu(const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t batch = a.size(0), m = a.size(1), k = a.size(2), n = b.size(2);
  if (batch == 0 || m == 0 || n == 0) return;
  if (cpu::is_16bit_float(a.dtype())) {  // See Note [16-bit CPU kernels stage through float32]
    Tensor out32 = cpu::float32_like(out);
    bmm_cpu(cpu::float32_copy(a), cpu::float32_copy(b), out32);
    return cpu::round_into(out32, out);
  }
  dispatch_floating(a.dtype(), "bmm", [&]<typename T>() {
    T* pc = out.data_ptr<T>();
    if (k == 0) {
      for (int64_t i = 0; i < batch; ++i)
        empty_product(pc + i * out.stride(0), m, n, out.stride(1), out.stride(2), 0.0);
      return;
    }
    const Operand la = operand_layout("bmm", "the first operand", m, k, a.stride(1), a.stride(2));
    const Operand lb = operand_layout("bmm", "the second operand", k, n, b.stride(1), b.stride(2));
    const blasint ldc = out_leading_dim("bmm", m, n, out.stride(1), out.stride(2));
    const blasint bm = to_blas_int(m, "bmm"), bn = to_blas_int(n, "bmm"), bk = to_blas_int(k, "bmm");
    const T* pa = a.data_ptr<T>();
    const T* pb = b.data_ptr<T>();
    const int64_t sa = a.stride(0), sb = b.stride(0), sc = out.stride(0);
    // Note [BLAS threads]: threads over the batch when there is a matrix for each of
    // them, or when the matrices are too small for BLAS to thread well; else one gemm at
    // a time, each on all threads.
    const bool over_batch = batch > 1 && (batch >= omp_get_max_threads() || m * n * k < kSmallGemm);
#pragma omp parallel for schedule(static) if (over_batch)
    for (int64_t i = 0; i < batch; ++i) gemm(la, lb, bm, bn, bk, pa + i * sa, pb + i * sb, T(0), pc + i * sc, ldc);
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(mm_kernel, DeviceType::CPU, mm_cpu);
LOOM_REGISTER_KERNEL(bmm_kernel, DeviceType::CPU, bmm_cpu);

}  // namespace loom::cpu
