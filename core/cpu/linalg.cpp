// CPU matrix multiplication: mm and bmm on OpenBLAS's gemm (float32 and float64), and on
// oneDNN's matmul primitive for bfloat16 (Note [bfloat16 matmul]) and for large float32
// products on AVX-512 CPUs (Note [float32 matmul on oneDNN]).
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
//
// Note [bfloat16 matmul]
// bfloat16 mm and bmm run on oneDNN's matmul primitive where the CPU has bf16 kernels
// (Note [bfloat16 on the CPU], core/cpu/bf16_path.h): bf16 operands, float32
// accumulation, a bf16 result (as PyTorch's autocast mm gives), beta = 1 as oneDNN's sum
// post-op. oneDNN reads each operand through explicit strides, described from the same
// (transpose, leading dimension) pair as gemm's (Note [BLAS operand layout]), and a
// batch stride of 0 as a broadcast batch of one. (OpenBLAS's sbgemm would do as well,
// but writes float32 only, so the result would need a rounding pass.) Primitives are
// cached per shape and layout (Note [oneDNN plan cache]).
//
// Note [float32 matmul on oneDNN]
// On a CPU with AVX-512, a float32 mm with at least kLargeGemm multiply-adds runs on the
// same oneDNN matmul primitive (its brgemm kernels) instead of OpenBLAS. Measured at a
// ViT-tiny's shapes (8320 tokens x 192..768, 2 threads, AMD EPYC with AVX-512): oneDNN
// 325-417 GFLOP/s; OpenBLAS 0.3.21 337-378 when it picks its own kernels, and 168-206
// when held to its Haswell kernels (OPENBLAS_CORETYPE=Haswell, which some machines set
// because that OpenBLAS predates their CPU). Small products stay on OpenBLAS, whose call
// costs less than a oneDNN execute; float64 (the gradient checks) always does. Either
// library gives the same bits for the same shapes and thread count, which is what the
// transparency tests compare; under LOOM_CPU_ISA=avx2 (Note [CPU ISA switch]) every
// float32 product is OpenBLAS's, as on an AVX2 CPU.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <tuple>
#include <unordered_map>

#include "core/cpu/bf16_path.h"        // defines: bf16_path (Note [bfloat16 on the CPU])
#include "core/cpu/cpu_isa.h"          // defines: onednn_has_avx512 (Note [CPU ISA switch])
#include "core/cpu/float32_staging.h"  // defines: float32_copy (Note [16-bit CPU kernels stage through float32])
#include "core/cpu/onednn.h"           // defines: PlanCache, cpu_engine, scratchpad (Note [oneDNN plan cache])
#include "core/kernels.h"

namespace loom::cpu {
namespace {

// Below this many multiply-adds per matrix, BLAS's own threading costs more than it
// saves, so bmm spreads the batch over threads even when the batch is small.
constexpr int64_t kSmallGemm = 64 * 64 * 64;

// From this many multiply-adds a float32 mm runs on oneDNN: Note [float32 matmul on oneDNN].
constexpr int64_t kLargeGemm = 128 * 128 * 256;

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

// ---- bfloat16 on oneDNN: Note [bfloat16 matmul] ---------------------------------------------

using dnnl::memory;

// One matmul operand as oneDNN reads it: [batch, rows, cols] and their strides.
struct MatmulOperand {
  memory::dims dims, strides;
  auto operator<=>(const MatmulOperand&) const = default;
};

// A batch stride of 0 (one matrix for the whole batch) is oneDNN's broadcast: batch 1.
MatmulOperand matmul_operand(const Operand& layout, int64_t batch, int64_t batch_stride, int64_t rows,
                             int64_t cols) {
  const int64_t span = std::max<int64_t>(int64_t{layout.ld} * (layout.trans == CblasNoTrans ? rows : cols), 1);
  const bool broadcast = batch_stride == 0 || batch == 1;
  return MatmulOperand{{broadcast ? 1 : batch, rows, cols},
                       {broadcast ? span : batch_stride, layout.trans == CblasNoTrans ? layout.ld : 1,
                        layout.trans == CblasNoTrans ? 1 : layout.ld}};
}

struct MatmulKey {
  MatmulOperand a, b, out;
  memory::data_type dtype;
  bool accumulate;  // beta == 1
  auto operator<=>(const MatmulKey&) const = default;
};

struct MatmulPlan {
  dnnl::matmul primitive;
  memory::desc a, b, out, scratchpad;
};

std::shared_ptr<const MatmulPlan> build_matmul_plan(const MatmulKey& key) {
  auto desc = [&](const MatmulOperand& x) { return memory::desc(x.dims, key.dtype, x.strides); };
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // Note [oneDNN scratchpad]
  if (key.accumulate) {
    dnnl::post_ops post;
    post.append_sum(1.0f);
    attr.set_post_ops(post);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(desc(key.a), desc(key.b), desc(key.out)), attr,
                                  onednn::cpu_engine());
  auto plan = std::make_shared<MatmulPlan>();
  plan->primitive = dnnl::matmul(pd);
  plan->a = pd.src_desc();
  plan->b = pd.weights_desc();
  plan->out = pd.dst_desc();
  plan->scratchpad = pd.scratchpad_desc();
  return plan;
}

// out[batch, m, n] (+)= a[batch, m, k] @ b[batch, k, n]; mm passes batch 1 and zero batch strides.
void matmul_onednn(const char* op, const Tensor& a, const Tensor& b, double beta, Tensor& out, int64_t batch,
                   const int64_t a_strides[3], const int64_t b_strides[3], const int64_t out_strides[3]) {
  const int64_t m = out.size(out.dim() - 2), n = out.size(out.dim() - 1), k = a.size(a.dim() - 1);
  const Operand la = operand_layout(op, "the first operand", m, k, a_strides[1], a_strides[2]);
  const Operand lb = operand_layout(op, "the second operand", k, n, b_strides[1], b_strides[2]);
  const blasint ldc = out_leading_dim(op, m, n, out_strides[1], out_strides[2]);
  const MatmulKey key{matmul_operand(la, batch, a_strides[0], m, k), matmul_operand(lb, batch, b_strides[0], k, n),
                      MatmulOperand{{batch, m, n}, {batch == 1 ? m * ldc : out_strides[0], ldc, 1}},
                      onednn::data_type(a.dtype()), beta == 1.0};
  auto describe = [&] {
    return detail::str(op, ": oneDNN could not multiply ", a.dtype(), " matrices ", a.shape(), " @ ", b.shape());
  };
  static onednn::PlanCache<MatmulKey, MatmulPlan> cache;
  try {
    const std::shared_ptr<const MatmulPlan> plan = cache.get(key, build_matmul_plan);
    const dnnl::engine& engine = onednn::cpu_engine();
    dnnl::stream stream(engine);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(plan->a, engine, a.raw_data())},
                                         {DNNL_ARG_WEIGHTS, memory(plan->b, engine, b.raw_data())},
                                         {DNNL_ARG_DST, memory(plan->out, engine, out.raw_data())}};
    Tensor scratchpad;  // Note [oneDNN scratchpad]
    if (plan->scratchpad.get_size() > 0) {
      scratchpad = onednn::workspace(plan->scratchpad);
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(plan->scratchpad, engine, scratchpad.raw_data()));
    }
    plan->primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    onednn::fail(__FILE__, __LINE__, describe(), e);
  }
}

bool matmul_on_onednn(DType dtype) { return dtype == kBFloat16 && bf16_path() != Bf16Path::Staging; }

// See Note [float32 matmul on oneDNN].
bool large_float32_on_onednn(DType dtype, int64_t multiply_adds) {
  return dtype == kFloat32 && multiply_adds >= kLargeGemm && onednn_has_avx512();
}

// ---- the kernels ------------------------------------------------------------------------

void mm_cpu(const Tensor& a, const Tensor& b, double beta, Tensor& out) {
  LOOM_CHECK(beta == 0.0 || beta == 1.0, "mm: beta must be 0 or 1, got ", beta);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  if ((matmul_on_onednn(a.dtype()) || large_float32_on_onednn(a.dtype(), m * n * k)) && k > 0) {
    const int64_t sa[3] = {0, a.stride(0), a.stride(1)}, sb[3] = {0, b.stride(0), b.stride(1)},
                  so[3] = {0, out.stride(0), out.stride(1)};
    return matmul_onednn("mm", a, b, beta, out, 1, sa, sb, so);
  }
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
  if (matmul_on_onednn(a.dtype()) && k > 0) {
    const int64_t sa[3] = {a.stride(0), a.stride(1), a.stride(2)}, sb[3] = {b.stride(0), b.stride(1), b.stride(2)},
                  so[3] = {out.stride(0), out.stride(1), out.stride(2)};
    return matmul_onednn("bmm", a, b, 0.0, out, batch, sa, sb, so);
  }
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
