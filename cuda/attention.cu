// CUDA fused scaled-dot-product attention, forward and backward: the GPU twin of
// core/cpu/attention.cpp (core/kernels.h: flash_attention_forward_kernel and _backward).
//
// Note [Flash attention on the GPU]
// The algorithm is the CPU's (Note [Flash attention on the CPU], core/cpu/attention.cpp):
// FlashAttention-2's online softmax, no [L, S] matrix in memory, backward recomputing
// the probabilities from q, k and the saved log-sum-exp. It is written to be read and
// checked against the CPU, not to be fast: plain shared-memory tiles and dot products,
// no tensor cores, no pipelining of loads.
//
//   attention_forward   one block (256 threads, 8 warps) per (batch-head n, tile of kBq = 16
//                       queries). The query tile sits in shared memory; the block walks the
//                       key tiles of kBk = 32 keys (under causal masking only those up to its
//                       last query), loading K and V tiles into shared memory, and
//                         s   = scale * q k^T + mask  (-inf where causal hides the key)
//                         m'  = max(m, rowmax(s));  p = exp(s - m');  c = exp(m - m')
//                         l   = c * l + rowsum(p);  acc = c * acc + p v;  m = m'
//                       One warp owns a query row in the softmax step (lane j = key j: the
//                       row max and sum are warp shuffles), threads own (row, feature)
//                       pairs in the p v step. At the end out = acc / l, lse = m + log l.
//   attention_row_dot   D_i = sum_e dout_ie out_ie, one warp per query row (0 for a fully
//                       masked row).
//   attention_grad_kv   one block per (n, key tile): dk and dv of its kBk keys accumulate in
//                       shared memory over every query tile that sees them:
//                         p = exp(s - lse);  dp = dout v^T;  ds = p * (dp - D)
//                         dv += p^T dout;    dk += scale * ds^T q
//   attention_grad_q    one block per (n, query tile): dq += scale * ds k over its key tiles.
// Splitting the backward into a key-side and a query-side kernel recomputes p twice but
// gives every gradient element one writer: no atomics, and results that do not depend on
// scheduling. Sums accumulate in float32 for float32 and 16-bit inputs (double for double),
// lse and D in the same type.
//
// Shared memory is dynamic, sized by the head dims E and Ev (the K and V tiles padded by
// one column, so that the 32 lanes reading 32 keys' element e hit 32 banks); above the
// default 48 KiB per block the kernel opts in to the device's maximum, and a head dim too
// large even for that is an error naming it.
//
// A row whose every key is masked has l = 0: its output is NaN and lse +inf, as on the
// CPU, and in backward its p is 0, so it sends no gradient to q, k or v. Results agree
// with the CPU's to float32 rounding (sums in another order; CUDA's exp is not the CPU's).
#include <algorithm>
#include <limits>

#include "core/kernels.h"
#include "cuda/kernel_utils.cuh"  // defines: dense, check_dense_output
#include "cuda/loops.cuh"         // defines: dispatch_types, widen, narrow, compute_t, kMaxDims

namespace loom::cuda {
namespace {

constexpr int kBq = 16;          // queries per tile
constexpr int kBk = 32;          // keys per tile: one per lane
constexpr int kThreads = 256;    // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr size_t kDefaultSharedBytes = 48 * 1024;

__host__ __device__ inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ inline int64_t tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

template <typename Acc>
__device__ inline Acc warp_max(Acc v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const Acc other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

template <typename Acc>
__device__ inline Acc warp_sum(Acc v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Where batch-head n's [L, S] mask starts: its leading dims are q's batch dims, flattened
// into N, each with its own (possibly 0) stride -- the CPU's mask_offset, computed per block.
struct MaskLayout {
  int lead = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int64_t stride_l = 0, stride_s = 0;

  __device__ int64_t offset(int64_t n) const {
    int64_t rest = n, off = 0;
    for (int d = lead - 1; d >= 0; --d) {
      off += (rest % sizes[d]) * strides[d];
      rest /= sizes[d];
    }
    return off;
  }
};

template <typename T>
struct Problem {
  using Acc = compute_t<T>;
  const T* q;
  const T* k;
  const T* v;
  const T* mask;  // null: no additive mask
  MaskLayout mask_layout;
  int64_t N, L, S, E, Ev;
  bool causal;
  Acc scale;

  __device__ int64_t key_end(int64_t i0, int64_t rows) const { return causal ? imin(S, i0 + rows) : S; }
};

// Shared memory: `count` elements of Acc carved one after another from the dynamic buffer.
template <typename Acc>
struct Carve {
  Acc* next;
  __device__ Acc* take(int64_t count) {
    Acc* at = next;
    next += count;
    return at;
  }
};

extern __shared__ __align__(16) unsigned char attention_shared[];

// rows x width elements of a [*, width] tensor starting at row `first`, into a tile with
// leading dimension ld (width or width + 1).
template <typename T>
__device__ inline void load_tile(compute_t<T>* tile, int64_t ld, const T* src, int64_t first, int64_t rows,
                                 int64_t width) {
  const T* at = src + first * width;
  for (int64_t idx = threadIdx.x; idx < rows * width; idx += blockDim.x)
    tile[(idx / width) * ld + idx % width] = widen(at[idx]);
}

// s[r][j] = scale * q_r . k_j + mask for queries [i0, i0 + rows), keys [j0, j0 + cols) of
// batch-head n; -inf where causal hides the key and outside the tile.
template <typename T>
__device__ inline void tile_scores(const Problem<T>& p, int64_t n, int64_t i0, int64_t rows, int64_t j0,
                                   int64_t cols, const compute_t<T>* qs, const compute_t<T>* ks, compute_t<T>* s) {
  using Acc = compute_t<T>;
  const Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  const int64_t mask_base = p.mask ? p.mask_layout.offset(n) : 0;
  for (int idx = threadIdx.x; idx < kBq * kBk; idx += blockDim.x) {
    const int r = idx / kBk, j = idx % kBk;
    Acc value = kNegInf;
    if (r < rows && j < cols) {
      const Acc* qr = qs + r * p.E;
      const Acc* kj = ks + j * (p.E + 1);
      Acc dot = Acc(0);
      for (int64_t e = 0; e < p.E; ++e) dot += qr[e] * kj[e];
      value = p.scale * dot;
      if (p.mask)
        value += widen(p.mask[mask_base + (i0 + r) * p.mask_layout.stride_l + (j0 + j) * p.mask_layout.stride_s]);
      if (p.causal && j0 + j > i0 + r) value = kNegInf;
    }
    s[idx] = value;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_forward(Problem<T> p, T* out, compute_t<T>* lse) {
  using Acc = compute_t<T>;
  const Acc kInf = std::numeric_limits<Acc>::infinity();
  Carve<Acc> carve{reinterpret_cast<Acc*>(attention_shared)};
  Acc* qs = carve.take(kBq * p.E);
  Acc* ks = carve.take(kBk * (p.E + 1));
  Acc* vs = carve.take(kBk * p.Ev);
  Acc* s = carve.take(kBq * kBk);
  Acc* acc = carve.take(kBq * p.Ev);
  Acc* m = carve.take(kBq);
  Acc* l = carve.take(kBq);
  Acc* c = carve.take(kBq);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t query_tiles = tiles(p.L, kBq);
  for (int64_t task = blockIdx.x; task < p.N * query_tiles; task += gridDim.x) {
    const int64_t n = task / query_tiles, i0 = (task % query_tiles) * kBq;
    const int64_t rows = imin(kBq, p.L - i0);
    load_tile(qs, p.E, p.q + n * p.L * p.E, i0, rows, p.E);
    for (int64_t idx = threadIdx.x; idx < kBq * p.Ev; idx += blockDim.x) acc[idx] = Acc(0);
    if (threadIdx.x < kBq) {
      m[threadIdx.x] = -kInf;
      l[threadIdx.x] = Acc(0);
    }
    const int64_t end = p.key_end(i0, rows);
    for (int64_t j0 = 0; j0 < end; j0 += kBk) {
      const int64_t cols = imin(kBk, p.S - j0);
      __syncthreads();  // the previous tile's readers are done (and q, acc, m, l are set)
      load_tile(ks, p.E + 1, p.k + n * p.S * p.E, j0, cols, p.E);
      load_tile(vs, p.Ev, p.v + n * p.S * p.Ev, j0, cols, p.Ev);
      __syncthreads();
      tile_scores(p, n, i0, rows, j0, cols, qs, ks, s);
      __syncthreads();
      for (int r = warp; r < rows; r += kWarps) {  // the online softmax step, a warp per row
        const Acc sv = s[r * kBk + lane];
        const Acc m_old = m[r];
        const Acc m_new = max(m_old, warp_max(sv));
        // Every key so far masked: nothing to add yet (and exp(-inf - -inf) would be NaN).
        const bool none = m_new == -kInf;
        const Acc prob = none ? Acc(0) : exp(sv - m_new);
        const Acc sum = warp_sum(prob);
        s[r * kBk + lane] = prob;
        if (lane == 0) {
          const Acc correction = none ? Acc(1) : exp(m_old - m_new);  // 0 while m was -inf
          l[r] = l[r] * correction + sum;
          m[r] = m_new;
          c[r] = correction;
        }
      }
      __syncthreads();
      for (int64_t idx = threadIdx.x; idx < rows * p.Ev; idx += blockDim.x) {
        const int64_t r = idx / p.Ev, e = idx % p.Ev;
        Acc a = acc[idx] * c[r];
        for (int64_t j = 0; j < cols; ++j) a += s[r * kBk + j] * vs[j * p.Ev + e];
        acc[idx] = a;
      }
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < rows * p.Ev; idx += blockDim.x) {
      const int64_t r = idx / p.Ev;
      const Acc value = l[r] == Acc(0) ? std::numeric_limits<Acc>::quiet_NaN() : acc[idx] * (Acc(1) / l[r]);
      out[(n * p.L + i0) * p.Ev + idx] = narrow<T>(value);
    }
    if (threadIdx.x < rows) {
      const int r = threadIdx.x;
      lse[n * p.L + i0 + r] = l[r] == Acc(0) ? kInf : m[r] + log(l[r]);
    }
    __syncthreads();  // the next task rewrites q, acc, m and l
  }
}

// d[i] = sum_e dout[i, e] * out[i, e]; 0 for a fully masked row (lse = +inf).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_row_dot(const T* dout, const T* out, const compute_t<T>* lse, int64_t rows, int64_t Ev,
                      compute_t<T>* d) {
  using Acc = compute_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; i < rows; i += warps) {
    Acc sum = Acc(0);
    for (int64_t e = lane; e < Ev; e += 32) sum += widen(dout[i * Ev + e]) * widen(out[i * Ev + e]);
    sum = warp_sum(sum);
    if (lane == 0) d[i] = lse[i] == std::numeric_limits<Acc>::infinity() ? Acc(0) : sum;
  }
}

// For one (query tile, key tile): p (into s) and ds = p * (dout v^T - D) (into ds).
template <typename T>
__device__ inline void tile_probabilities(const Problem<T>& p, int64_t n, int64_t i0, int64_t rows, int64_t j0,
                                          int64_t cols, const compute_t<T>* qs, const compute_t<T>* ks,
                                          const compute_t<T>* vs, const compute_t<T>* dos,
                                          const compute_t<T>* lse_s, const compute_t<T>* d_s, compute_t<T>* s,
                                          compute_t<T>* ds) {
  using Acc = compute_t<T>;
  const Acc kInf = std::numeric_limits<Acc>::infinity();
  tile_scores(p, n, i0, rows, j0, cols, qs, ks, s);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kBq * kBk; idx += blockDim.x) {
    const int r = idx / kBk, j = idx % kBk;
    Acc prob = Acc(0), grad = Acc(0);
    if (r < rows && j < cols) {
      prob = lse_s[r] == kInf ? Acc(0) : exp(s[idx] - lse_s[r]);
      const Acc* dor = dos + r * p.Ev;
      const Acc* vj = vs + j * (p.Ev + 1);
      Acc dp = Acc(0);
      for (int64_t e = 0; e < p.Ev; ++e) dp += dor[e] * vj[e];
      grad = prob * (dp - d_s[r]);
    }
    s[idx] = prob;
    ds[idx] = grad;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_grad_kv(Problem<T> p, const T* dout, const compute_t<T>* lse, const compute_t<T>* d, T* dk, T* dv) {
  using Acc = compute_t<T>;
  Carve<Acc> carve{reinterpret_cast<Acc*>(attention_shared)};
  Acc* ks = carve.take(kBk * (p.E + 1));
  Acc* vs = carve.take(kBk * (p.Ev + 1));
  Acc* dks = carve.take(kBk * p.E);
  Acc* dvs = carve.take(kBk * p.Ev);
  Acc* qs = carve.take(kBq * p.E);
  Acc* dos = carve.take(kBq * p.Ev);
  Acc* s = carve.take(kBq * kBk);
  Acc* ds = carve.take(kBq * kBk);
  Acc* lse_s = carve.take(kBq);
  Acc* d_s = carve.take(kBq);
  const int64_t key_tiles = tiles(p.S, kBk);
  for (int64_t task = blockIdx.x; task < p.N * key_tiles; task += gridDim.x) {
    const int64_t n = task / key_tiles, j0 = (task % key_tiles) * kBk;
    const int64_t cols = imin(kBk, p.S - j0);
    load_tile(ks, p.E + 1, p.k + n * p.S * p.E, j0, cols, p.E);
    load_tile(vs, p.Ev + 1, p.v + n * p.S * p.Ev, j0, cols, p.Ev);
    for (int64_t idx = threadIdx.x; idx < kBk * p.E; idx += blockDim.x) dks[idx] = Acc(0);
    for (int64_t idx = threadIdx.x; idx < kBk * p.Ev; idx += blockDim.x) dvs[idx] = Acc(0);
    // Under causal masking, query rows before j0 see none of these keys.
    const int64_t first = p.causal ? (j0 / kBq) * kBq : 0;
    for (int64_t i0 = first; i0 < p.L; i0 += kBq) {
      const int64_t rows = imin(kBq, p.L - i0);
      __syncthreads();  // the previous query tile's readers are done
      load_tile(qs, p.E, p.q + n * p.L * p.E, i0, rows, p.E);
      load_tile(dos, p.Ev, dout + n * p.L * p.Ev, i0, rows, p.Ev);
      if (threadIdx.x < rows) {
        lse_s[threadIdx.x] = lse[n * p.L + i0 + threadIdx.x];
        d_s[threadIdx.x] = d[n * p.L + i0 + threadIdx.x];
      }
      __syncthreads();
      tile_probabilities(p, n, i0, rows, j0, cols, qs, ks, vs, dos, lse_s, d_s, s, ds);
      __syncthreads();
      for (int64_t idx = threadIdx.x; idx < cols * p.Ev; idx += blockDim.x) {
        const int64_t j = idx / p.Ev, e = idx % p.Ev;
        Acc sum = Acc(0);
        for (int64_t r = 0; r < rows; ++r) sum += s[r * kBk + j] * dos[r * p.Ev + e];
        dvs[idx] += sum;
      }
      for (int64_t idx = threadIdx.x; idx < cols * p.E; idx += blockDim.x) {
        const int64_t j = idx / p.E, e = idx % p.E;
        Acc sum = Acc(0);
        for (int64_t r = 0; r < rows; ++r) sum += ds[r * kBk + j] * qs[r * p.E + e];
        dks[idx] += p.scale * sum;
      }
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < cols * p.E; idx += blockDim.x)
      dk[(n * p.S + j0) * p.E + idx] = narrow<T>(dks[idx]);
    for (int64_t idx = threadIdx.x; idx < cols * p.Ev; idx += blockDim.x)
      dv[(n * p.S + j0) * p.Ev + idx] = narrow<T>(dvs[idx]);
    __syncthreads();  // the next task rewrites every tile
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attention_grad_q(Problem<T> p, const T* dout, const compute_t<T>* lse, const compute_t<T>* d, T* dq) {
  using Acc = compute_t<T>;
  Carve<Acc> carve{reinterpret_cast<Acc*>(attention_shared)};
  Acc* qs = carve.take(kBq * p.E);
  Acc* dos = carve.take(kBq * p.Ev);
  Acc* dqs = carve.take(kBq * p.E);
  Acc* ks = carve.take(kBk * (p.E + 1));
  Acc* vs = carve.take(kBk * (p.Ev + 1));
  Acc* s = carve.take(kBq * kBk);
  Acc* ds = carve.take(kBq * kBk);
  Acc* lse_s = carve.take(kBq);
  Acc* d_s = carve.take(kBq);
  const int64_t query_tiles = tiles(p.L, kBq);
  for (int64_t task = blockIdx.x; task < p.N * query_tiles; task += gridDim.x) {
    const int64_t n = task / query_tiles, i0 = (task % query_tiles) * kBq;
    const int64_t rows = imin(kBq, p.L - i0);
    load_tile(qs, p.E, p.q + n * p.L * p.E, i0, rows, p.E);
    load_tile(dos, p.Ev, dout + n * p.L * p.Ev, i0, rows, p.Ev);
    for (int64_t idx = threadIdx.x; idx < kBq * p.E; idx += blockDim.x) dqs[idx] = Acc(0);
    if (threadIdx.x < rows) {
      lse_s[threadIdx.x] = lse[n * p.L + i0 + threadIdx.x];
      d_s[threadIdx.x] = d[n * p.L + i0 + threadIdx.x];
    }
    const int64_t end = p.key_end(i0, rows);
    for (int64_t j0 = 0; j0 < end; j0 += kBk) {
      const int64_t cols = imin(kBk, p.S - j0);
      __syncthreads();  // the previous key tile's readers are done
      load_tile(ks, p.E + 1, p.k + n * p.S * p.E, j0, cols, p.E);
      load_tile(vs, p.Ev + 1, p.v + n * p.S * p.Ev, j0, cols, p.Ev);
      __syncthreads();
      tile_probabilities(p, n, i0, rows, j0, cols, qs, ks, vs, dos, lse_s, d_s, s, ds);
      __syncthreads();
      for (int64_t idx = threadIdx.x; idx < rows * p.E; idx += blockDim.x) {
        const int64_t r = idx / p.E, e = idx % p.E;
        Acc sum = Acc(0);
        for (int64_t j = 0; j < cols; ++j) sum += ds[r * kBk + j] * ks[j * (p.E + 1) + e];
        dqs[idx] += p.scale * sum;
      }
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < rows * p.E; idx += blockDim.x)
      dq[(n * p.L + i0) * p.E + idx] = narrow<T>(dqs[idx]);
    __syncthreads();  // the next task rewrites every tile
  }
}

template <typename T>
Problem<T> problem_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                      double scale) {
  Problem<T> p{};
  p.q = static_cast<const T*>(q.raw_data());
  p.k = static_cast<const T*>(k.raw_data());
  p.v = static_cast<const T*>(v.raw_data());
  p.N = q.size(0);
  p.L = q.size(1);
  p.S = k.size(1);
  p.E = q.size(2);
  p.Ev = v.size(2);
  p.causal = is_causal;
  p.scale = static_cast<compute_t<T>>(scale);
  p.mask = nullptr;
  if (mask.defined()) {
    LOOM_CHECK(mask.dtype() == q.dtype() && mask.dim() >= 2 && mask.size(-2) == p.L && mask.size(-1) == p.S,
               "scaled_dot_product_attention on CUDA: expected an additive mask of dtype ", q.dtype(),
               " and shape [*batch, ", p.L, ", ", p.S, "], got ", mask.str());
    const int64_t lead = mask.dim() - 2;
    LOOM_CHECK(lead <= kMaxDims, "scaled_dot_product_attention on CUDA: the mask has ", lead,
               " batch dims; at most ", kMaxDims, " are supported (reshape the batch dims into fewer)");
    p.mask = static_cast<const T*>(mask.raw_data());
    p.mask_layout.lead = static_cast<int>(lead);
    for (int64_t d = 0; d < lead; ++d) {
      p.mask_layout.sizes[d] = mask.size(d);
      p.mask_layout.strides[d] = mask.stride(d);
    }
    p.mask_layout.stride_l = mask.stride(lead);
    p.mask_layout.stride_s = mask.stride(lead + 1);
  }
  return p;
}

void check_lse(const char* op, const Tensor& lse, DType expected, int64_t n, int64_t l) {
  LOOM_CHECK(lse.dtype() == expected && lse.numel() == n * l && lse.is_contiguous(), op,
             " on CUDA: expected a dense log-sum-exp [", n, ", ", l, "] of dtype ", expected, ", got ", lse.str());
}

// Launches `kernel` with `bytes` of dynamic shared memory, opting in above the default
// 48 KiB (see Note [Flash attention on the GPU]).
template <typename Kernel>
void allow_shared_memory(Kernel* kernel, size_t bytes, int device, const char* op, int64_t E, int64_t Ev) {
  if (bytes <= kDefaultSharedBytes) return;
  int optin = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                  "reading the shared memory limit of cuda:", device);
  LOOM_CHECK(bytes <= static_cast<size_t>(optin), op, " on CUDA: head dims E = ", E, " and Ev = ", Ev, " need ",
             bytes, " bytes of shared memory per block, more than the ", optin, " of cuda:", device,
             "; use smaller heads (more of them), or run attention with dropout_p > 0 or on the CPU");
  LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                  "allowing ", bytes, " bytes of shared memory for ", op);
}

unsigned task_grid(int64_t tasks, int device) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, imin(tasks, static_cast<int64_t>(multiprocessor_count(device)) * 64)));
}

void flash_attention_forward_cuda(const Tensor& q_any, const Tensor& k_any, const Tensor& v_any, const Tensor& mask,
                                  bool is_causal, double scale, Tensor& out, Tensor& lse) {
  constexpr const char* kOp = "scaled_dot_product_attention";
  check_dense_output(kOp, out);
  const Tensor q = dense(q_any), k = dense(k_any), v = dense(v_any);
  const int device = out.device().index;
  DeviceGuard guard(device);
  dispatch_types(FloatAndHalfTypes{}, q.dtype(), kOp, [&]<typename T>() {
    using Acc = compute_t<T>;
    const Problem<T> p = problem_of<T>(q, k, v, mask, is_causal, scale);
    check_lse(kOp, lse, device_dtype<Acc>(), p.N, p.L);
    const int64_t tasks = p.N * tiles(p.L, kBq);
    if (tasks == 0) return;
    const size_t bytes =
        sizeof(Acc) * static_cast<size_t>(kBq * p.E + kBk * (p.E + 1) + kBk * p.Ev + kBq * kBk + kBq * p.Ev + 3 * kBq);
    allow_shared_memory(attention_forward<T>, bytes, device, kOp, p.E, p.Ev);
    attention_forward<T><<<task_grid(tasks, device), kThreads, bytes, current_stream(device).handle>>>(
        p, static_cast<T*>(out.raw_data()), static_cast<Acc*>(lse.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH(kOp);
  });
}

void flash_attention_backward_cuda(const Tensor& grad_out_any, const Tensor& q_any, const Tensor& k_any,
                                   const Tensor& v_any, const Tensor& mask, bool is_causal, double scale,
                                   const Tensor& out_any, const Tensor& lse_any, Tensor& grad_q, Tensor& grad_k,
                                   Tensor& grad_v) {
  constexpr const char* kOp = "scaled_dot_product_attention_backward";
  check_dense_output(kOp, grad_q);
  check_dense_output(kOp, grad_k);
  check_dense_output(kOp, grad_v);
  const Tensor q = dense(q_any), k = dense(k_any), v = dense(v_any);
  const Tensor grad_out = dense(grad_out_any), out = dense(out_any), lse = dense(lse_any);
  const int device = grad_q.device().index;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device).handle;
  dispatch_types(FloatAndHalfTypes{}, q.dtype(), kOp, [&]<typename T>() {
    using Acc = compute_t<T>;
    const Problem<T> p = problem_of<T>(q, k, v, mask, is_causal, scale);
    check_lse(kOp, lse, device_dtype<Acc>(), p.N, p.L);
    if (p.N == 0) return;
    if (p.L == 0 || p.S == 0) {  // no scores: nothing reaches any input
      for (Tensor* t : {&grad_q, &grad_k, &grad_v})
        if (t->numel() > 0)
          LOOM_CUDA_CHECK(cudaMemsetAsync(t->raw_data(), 0, t->numel() * element_size(t->dtype()), stream),
                          "zeroing an attention gradient ", t->shape());
      return;
    }
    const T* dout = static_cast<const T*>(grad_out.raw_data());
    const Acc* lse_p = static_cast<const Acc*>(lse.raw_data());
    Tensor d = empty({p.N * p.L}, TensorOptions(device_dtype<Acc>()).device(grad_q.device()));
    const int64_t rows = p.N * p.L;
    attention_row_dot<T><<<task_grid(tiles(rows, kWarps), device), kThreads, 0, stream>>>(
        dout, static_cast<const T*>(out.raw_data()), lse_p, rows, p.Ev, static_cast<Acc*>(d.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH("scaled_dot_product_attention_backward (row dots)");
    const Acc* d_p = static_cast<const Acc*>(d.raw_data());

    const size_t kv_bytes = sizeof(Acc) * static_cast<size_t>(kBk * (p.E + 1) + kBk * (p.Ev + 1) + kBk * p.E +
                                                              kBk * p.Ev + kBq * p.E + kBq * p.Ev + 2 * kBq * kBk +
                                                              2 * kBq);
    allow_shared_memory(attention_grad_kv<T>, kv_bytes, device, kOp, p.E, p.Ev);
    attention_grad_kv<T><<<task_grid(p.N * tiles(p.S, kBk), device), kThreads, kv_bytes, stream>>>(
        p, dout, lse_p, d_p, static_cast<T*>(grad_k.raw_data()), static_cast<T*>(grad_v.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH("scaled_dot_product_attention_backward (key, value)");

    const size_t q_bytes = sizeof(Acc) * static_cast<size_t>(2 * kBq * p.E + kBq * p.Ev + kBk * (p.E + 1) +
                                                             kBk * (p.Ev + 1) + 2 * kBq * kBk + 2 * kBq);
    allow_shared_memory(attention_grad_q<T>, q_bytes, device, kOp, p.E, p.Ev);
    attention_grad_q<T><<<task_grid(p.N * tiles(p.L, kBq), device), kThreads, q_bytes, stream>>>(
        p, dout, lse_p, d_p, static_cast<T*>(grad_q.raw_data()));
    LOOM_CUDA_CHECK_LAUNCH("scaled_dot_product_attention_backward (query)");
  });
}

}  // namespace

LOOM_REGISTER_KERNEL(flash_attention_forward_kernel, DeviceType::CUDA, flash_attention_forward_cuda);
LOOM_REGISTER_KERNEL(flash_attention_backward_kernel, DeviceType::CUDA, flash_attention_backward_cuda);

}  // namespace loom::cuda
