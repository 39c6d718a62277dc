// CPU fused scaled-dot-product attention: out = softmax(scale * q k^T + mask) v, forward
// and backward, without the [L, S] attention matrix in memory.
//
// Note [Flash attention on the CPU]
// The composition of matmul, softmax and matmul keeps, per batch and head, the [L, S]
// scores and probabilities for backward: for ViT-tiny on CIFAR (65 tokens, 3 heads,
// batch 128) 2 x 6 MiB per block, for a long sequence quadratically more. This kernel is
// FlashAttention-2's algorithm on OpenBLAS. The queries of one (batch, head) are cut into
// blocks of Bq rows and the keys into blocks of Bk; a query block walks the key blocks
// keeping, per row, the running maximum m, the running sum l of exp(s - m) and an
// unnormalised output acc:
//   s = scale * q_blk k_blk^T + mask                       [Bq, Bk], a scratch block
//   m' = max(m, rowmax(s));  p = exp(s - m');  c = exp(m - m')
//   l = c * l + rowsum(p);   acc = c * acc + p v_blk;  m = m'
// and at the end out = acc / l, lse = m + log(l) (the online softmax: each block's
// probabilities are rescaled once the true maximum is known, so no block is kept).
// What backward saves is q, k, v, out and lse ([N, L]), never the probabilities. It
// recomputes them block by block, exactly: p = exp(scale * q k^T + mask - lse). With
// D_i = sum_e dout_ie out_ie (= sum_j p_ij dp_ij):
//   dv_blk += p^T dout_blk;   dp = dout_blk v_blk^T;   ds = p * (dp - D)
//   dq_blk += scale * ds k_blk;   dk_blk += scale * ds^T q_blk
// Forward threads take (batch-head, query block) pairs; backward threads take whole
// batch-heads, so every dq, dk and dv row has one writer (a transformer has batch x heads
// in the hundreds; with fewer than the thread count, backward runs on fewer threads).
// Causal attention skips the key blocks wholly above the diagonal and masks inside the
// diagonal ones. Each gemm runs inside an OpenMP region, so on one thread (Note [BLAS
// threads], core/cpu/linalg.cpp).
//
// Note [Attention reads the heads in place]
// A multi-head attention's q, k, v are [N, H, L, E] views of the projections' [N, L, H*E]
// outputs: a transpose, whose rows of E features are H*E apart. Copying them into dense
// heads, and the output and every gradient back, cost about 6% of a ViT's training step.
// The kernel reads and writes such views where they lie instead: every operand is a set
// of rows (Rows below) with a base offset per batch-head and a row stride, which is what
// a gemm's leading dimension already is. Only the last dim must have stride 1; an operand
// without it is copied. The autograd op allocates the output and gradients in their
// inputs' layout (autograd/ops/attention.cpp), so the transposes back are views as well.
//
// A row whose every key is masked has no softmax: its output is NaN, as the composition's
// is (softmax of all -inf), its lse is +inf, and it sends no gradient to k and v.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>  // defines: std::remove_const_t (Rows of const inputs)
#include <vector>

#include "core/cpu/contiguous.h"           // defines: contiguous_input, check_output_dense
#include "core/cpu/transformer_kernels.h"  // declares: flash_attention_forward, flash_attention_backward
#include "core/cpu/vector_math.h"          // defines: vector_exp (Note [Vectorisable exp and erf])
#include "core/dtype.h"                    // defines: dispatch_floating
#include "core/kernels.h"                  // declares: flash_attention_forward_kernel, flash_attention_backward_kernel

namespace loom::cpu {
namespace {

constexpr int64_t kWorkGrain = 1 << 15;  // multiply-adds below which one thread does everything

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha,
              a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha,
              a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// Where batch-head n of a [*batch, rows, cols] view starts: the mixed-radix sum of n's
// coordinates in the batch dims times their strides (a transposed [N, H, L, E] view, or a
// broadcast [B, 1, L, S] mask, is no [N, L, E] view, so one stride would not do).
std::vector<int64_t> batch_offsets(const Tensor& t, int64_t N) {
  const int64_t lead = t.dim() - 2;
  std::vector<int64_t> offsets(static_cast<size_t>(N), 0);
  for (int64_t n = 0; n < N; ++n) {
    int64_t rest = n, offset = 0;
    for (int64_t d = lead - 1; d >= 0; --d) {
      offset += (rest % t.size(d)) * t.stride(d);
      rest /= t.size(d);
    }
    offsets[static_cast<size_t>(n)] = offset;
  }
  return offsets;
}

// One operand as rows of unit-stride features: Note [Attention reads the heads in place].
template <typename T>
struct Rows {
  T* base = nullptr;
  std::vector<int64_t> offset;  // per batch-head
  int64_t ld = 0;               // elements from one row to the next
  T* row(int64_t n, int64_t i) const { return base + offset[static_cast<size_t>(n)] + i * ld; }
};

template <typename T>
Rows<T> rows_of(const Tensor& t, int64_t N) {
  return Rows<T>{t.data_ptr<std::remove_const_t<T>>(), batch_offsets(t, N), t.stride(-2)};
}

// An input whose features are not adjacent is copied; one that is, is read in place.
Tensor unit_stride_input(const Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : contiguous_input(t);
}

// Outputs are allocated by the caller with adjacent features and rows that do not overlap.
void check_output_rows(const char* kernel, const Tensor& out) {
  LOOM_CHECK(out.size(-1) <= 1 || out.stride(-1) == 1, kernel, ": expected an output whose last dim has stride 1, "
             "got strides ", out.strides(), " for shape ", out.shape());
}

// One attention problem's operands and sizes: N batch-heads of L queries and S keys.
template <typename T>
struct Problem {
  Rows<const T> q, k, v;
  const T* mask;  // null: no additive mask
  std::vector<int64_t> mask_offset;  // per batch-head: where its [L, S] mask starts
  int64_t mask_stride_l, mask_stride_s;
  int64_t N, L, S, E, Ev;
  bool causal;
  T scale;
  int64_t bq, bk;

  // s[r, j] (leading dim bk) = scale * q_i k_j^T + mask, -inf where causal hides key j from query i,
  // for queries [i0, i0 + rows) and keys [j0, j0 + cols) of batch-head n.
  void scores(int64_t n, int64_t i0, int64_t rows, int64_t j0, int64_t cols, T* s) const {
    gemm(CblasNoTrans, CblasTrans, rows, cols, E, scale, q.row(n, i0), q.ld, k.row(n, j0), k.ld, T(0), s, bk);
    if (mask) {
      const T* base = mask + mask_offset[n] + i0 * mask_stride_l + j0 * mask_stride_s;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) s[r * bk + j] += base[r * mask_stride_l + j * mask_stride_s];
    }
    if (causal && j0 + cols - 1 > i0) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = std::max<int64_t>(i0 + r + 1 - j0, 0); j < cols; ++j)
          s[r * bk + j] = -std::numeric_limits<T>::infinity();
    }
  }
  // Key blocks a query block [i0, i0 + rows) reads: all, or under causal masking up to its last row.
  int64_t key_end(int64_t i0, int64_t rows) const { return causal ? std::min(S, i0 + rows) : S; }
};

template <typename T>
Problem<T> problem_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                      double scale, AttentionBlocks blocks) {
  Problem<T> p{};
  p.N = 1;
  for (int64_t d = 0; d + 2 < q.dim(); ++d) p.N *= q.size(d);
  p.L = q.size(-2);
  p.S = k.size(-2);
  p.E = q.size(-1);
  p.Ev = v.size(-1);
  p.q = rows_of<const T>(q, p.N);
  p.k = rows_of<const T>(k, p.N);
  p.v = rows_of<const T>(v, p.N);
  p.mask = mask.defined() ? mask.data_ptr<T>() : nullptr;
  if (mask.defined()) {
    p.mask_offset = batch_offsets(mask, p.N);
    p.mask_stride_l = mask.stride(-2);
    p.mask_stride_s = mask.stride(-1);
  }
  p.causal = is_causal;
  p.scale = static_cast<T>(scale);
  LOOM_CHECK(blocks.query > 0 && blocks.key > 0, "flash_attention: block sizes must be positive, got query ",
             blocks.query, " and key ", blocks.key);
  p.bq = blocks.query;
  p.bk = blocks.key;
  return p;
}

// The online softmax of one query block: Note [Flash attention on the CPU].
template <typename T>
void forward_block(const Problem<T>& p, int64_t n, int64_t i0, T* s, T* acc, T* m, T* l, const Rows<T>& out,
                   T* lse) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const int64_t rows = std::min(p.bq, p.L - i0);
  std::fill(acc, acc + rows * p.Ev, T(0));
  std::fill(m, m + rows, -kInf);
  std::fill(l, l + rows, T(0));
  const int64_t end = p.key_end(i0, rows);
  for (int64_t j0 = 0; j0 < end; j0 += p.bk) {
    const int64_t cols = std::min(p.bk, p.S - j0);
    p.scores(n, i0, rows, j0, cols, s);
    for (int64_t r = 0; r < rows; ++r) {
      T* sr = s + r * p.bk;
      T block_max = -kInf;
      for (int64_t j = 0; j < cols; ++j) block_max = std::max(block_max, sr[j]);
      const T m_new = std::max(m[r], block_max);
      if (m_new == -kInf) {  // every key so far masked: nothing to add yet
        std::fill(sr, sr + cols, T(0));
        continue;
      }
      const T correction = std::exp(m[r] - m_new);  // 0 while m was -inf
      T sum = 0;
      for (int64_t j = 0; j < cols; ++j) {
        sr[j] = vector_exp(sr[j] - m_new);
        sum += sr[j];
      }
      l[r] = l[r] * correction + sum;
      m[r] = m_new;
      if (correction != T(1))
        for (int64_t e = 0; e < p.Ev; ++e) acc[r * p.Ev + e] *= correction;
    }
    gemm(CblasNoTrans, CblasNoTrans, rows, p.Ev, cols, T(1), s, p.bk, p.v.row(n, j0), p.v.ld, T(1), acc, p.Ev);
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out.row(n, i0 + r);
    if (l[r] == T(0)) {  // every key masked
      std::fill(o, o + p.Ev, std::numeric_limits<T>::quiet_NaN());
      lse[n * p.L + i0 + r] = kInf;
      continue;
    }
    const T inv = T(1) / l[r];
    for (int64_t e = 0; e < p.Ev; ++e) o[e] = acc[r * p.Ev + e] * inv;
    lse[n * p.L + i0 + r] = m[r] + std::log(l[r]);
  }
}

// What backward reads and writes besides the problem's q, k, v.
template <typename T>
struct Gradients {
  Rows<const T> dout, out;
  const T* lse;
  Rows<T> dq, dk, dv;
};

template <typename T>
void zero_rows(const Rows<T>& t, int64_t n, int64_t count, int64_t width) {
  for (int64_t i = 0; i < count; ++i) std::fill(t.row(n, i), t.row(n, i) + width, T(0));
}

// Every gradient of batch-head n: Note [Flash attention on the CPU].
template <typename T>
void backward_head(const Problem<T>& p, const Gradients<T>& g, int64_t n, T* s, T* dp, T* d) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < p.L; ++i) {
    const T* dout_row = g.dout.row(n, i);
    const T* out_row = g.out.row(n, i);
    T sum = 0;
    for (int64_t e = 0; e < p.Ev; ++e) sum += dout_row[e] * out_row[e];
    d[i] = g.lse[n * p.L + i] == kInf ? T(0) : sum;
  }
  zero_rows(g.dq, n, p.L, p.E);
  zero_rows(g.dk, n, p.S, p.E);
  zero_rows(g.dv, n, p.S, p.Ev);
  for (int64_t j0 = 0; j0 < p.S; j0 += p.bk) {
    const int64_t cols = std::min(p.bk, p.S - j0);
    // Under causal masking, query rows before j0 see none of these keys.
    const int64_t first = p.causal ? (j0 / p.bq) * p.bq : 0;
    for (int64_t i0 = first; i0 < p.L; i0 += p.bq) {
      const int64_t rows = std::min(p.bq, p.L - i0);
      p.scores(n, i0, rows, j0, cols, s);
      for (int64_t r = 0; r < rows; ++r) {
        const T row_lse = g.lse[n * p.L + i0 + r];
        T* sr = s + r * p.bk;
        if (row_lse == kInf) {  // a fully masked row
          std::fill(sr, sr + cols, T(0));
        } else {
          for (int64_t j = 0; j < cols; ++j) sr[j] = vector_exp(sr[j] - row_lse);
        }
      }
      gemm(CblasTrans, CblasNoTrans, cols, p.Ev, rows, T(1), s, p.bk, g.dout.row(n, i0), g.dout.ld, T(1),
           g.dv.row(n, j0), g.dv.ld);
      gemm(CblasNoTrans, CblasTrans, rows, cols, p.Ev, T(1), g.dout.row(n, i0), g.dout.ld, p.v.row(n, j0), p.v.ld,
           T(0), dp, p.bk);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) dp[r * p.bk + j] = s[r * p.bk + j] * (dp[r * p.bk + j] - d[i0 + r]);
      gemm(CblasNoTrans, CblasNoTrans, rows, p.E, cols, p.scale, dp, p.bk, p.k.row(n, j0), p.k.ld, T(1),
           g.dq.row(n, i0), g.dq.ld);
      gemm(CblasTrans, CblasNoTrans, cols, p.E, rows, p.scale, dp, p.bk, p.q.row(n, i0), p.q.ld, T(1),
           g.dk.row(n, j0), g.dk.ld);
    }
  }
}

}  // namespace

void flash_attention_forward(const Tensor& q_any, const Tensor& k_any, const Tensor& v_any, const Tensor& mask,
                             bool is_causal, double scale, Tensor& out, Tensor& lse, AttentionBlocks blocks) {
  check_output_rows("flash_attention", out);
  check_output_dense("flash_attention", lse);
  const Tensor q = unit_stride_input(q_any), k = unit_stride_input(k_any), v = unit_stride_input(v_any);
  dispatch_floating(q.dtype(), "scaled_dot_product_attention", [&]<typename T>() {
    const Problem<T> p = problem_of<T>(q, k, v, mask, is_causal, scale, blocks);
    const int64_t query_blocks = (p.L + p.bq - 1) / p.bq;
    const int64_t tasks = p.N * query_blocks;
    const Rows<T> o = rows_of<T>(out, p.N);
    T* lse_p = lse.data_ptr<T>();
#pragma omp parallel if (p.N * p.L * p.S * (p.E + p.Ev) > kWorkGrain && tasks > 1)
    {
      std::vector<T> s(static_cast<size_t>(p.bq * p.bk)), acc(static_cast<size_t>(p.bq * p.Ev));
      std::vector<T> m(static_cast<size_t>(p.bq)), l(static_cast<size_t>(p.bq));
#pragma omp for schedule(dynamic)
      for (int64_t t = 0; t < tasks; ++t)
        forward_block(p, t / query_blocks, (t % query_blocks) * p.bq, s.data(), acc.data(), m.data(), l.data(), o,
                      lse_p);
    }
  });
}

void flash_attention_backward(const Tensor& grad_out_any, const Tensor& q_any, const Tensor& k_any,
                              const Tensor& v_any, const Tensor& mask, bool is_causal, double scale,
                              const Tensor& out_any, const Tensor& lse_any, Tensor& grad_q, Tensor& grad_k,
                              Tensor& grad_v, AttentionBlocks blocks) {
  check_output_rows("flash_attention_backward", grad_q);
  check_output_rows("flash_attention_backward", grad_k);
  check_output_rows("flash_attention_backward", grad_v);
  const Tensor q = unit_stride_input(q_any), k = unit_stride_input(k_any), v = unit_stride_input(v_any);
  const Tensor grad_out = unit_stride_input(grad_out_any), out = unit_stride_input(out_any);
  const Tensor lse = contiguous_input(lse_any);
  dispatch_floating(q.dtype(), "scaled_dot_product_attention_backward", [&]<typename T>() {
    const Problem<T> p = problem_of<T>(q, k, v, mask, is_causal, scale, blocks);
    const Gradients<T> g{rows_of<const T>(grad_out, p.N), rows_of<const T>(out, p.N), lse.data_ptr<T>(),
                         rows_of<T>(grad_q, p.N),          rows_of<T>(grad_k, p.N),  rows_of<T>(grad_v, p.N)};
#pragma omp parallel if (p.N * p.L * p.S * (p.E + p.Ev) > kWorkGrain && p.N > 1)
    {
      std::vector<T> s(static_cast<size_t>(p.bq * p.bk)), dp(static_cast<size_t>(p.bq * p.bk));
      std::vector<T> d(static_cast<size_t>(p.L));
#pragma omp for schedule(dynamic)
      for (int64_t n = 0; n < p.N; ++n) backward_head(p, g, n, s.data(), dp.data(), d.data());
    }
  });
}

// The dispatched kernels run with the default blocks (tests call the functions above
// with small ones).
LOOM_REGISTER_KERNEL(flash_attention_forward_kernel, DeviceType::CPU,
                     [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                        double scale, Tensor& out, Tensor& lse) {
                       flash_attention_forward(q, k, v, mask, is_causal, scale, out, lse);
                     });
LOOM_REGISTER_KERNEL(flash_attention_backward_kernel, DeviceType::CPU,
                     [](const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        bool is_causal, double scale, const Tensor& out, const Tensor& lse, Tensor& grad_q,
                        Tensor& grad_k, Tensor& grad_v) {
                       flash_attention_backward(grad_out, q, k, v, mask, is_causal, scale, out, lse, grad_q, grad_k,
                                                grad_v);
                     });

}  // namespace loom::cpu

namespace loom {
// The stubs live beside their CPU kernels (core/kernels.h, "transformer kernels").
LOOM_DEFINE_KERNEL(flash_attention_forward_kernel);
LOOM_DEFINE_KERNEL(flash_attention_backward_kernel);
}  // namespace loom
