// The CPU kernels a transformer adds: layer norm, GELU and fused (flash) attention.
//
// Note [CPU-only kernels outside the dispatch table]
// Every stub in core/kernels.h must have a CUDA implementation: tests/test_cuda.cpp scans
// the registry and fails, GPU or not, when a kernel has a CPU slot and no CUDA one. These
// kernels have no CUDA twin yet, so they are plain functions in loom::cpu, called by their
// autograd ops (autograd/ops/layer_norm.cpp, gelu.cpp, attention.cpp) after
// require_cpu() has refused any other device with a message that says so. A CUDA backend
// for them moves each into core/kernels.h as a stub, with its CUDA kernel beside the CPU
// one, and deletes require_cpu() from its op.
//
// Conventions are core/kernels.h's: outputs are allocated by the caller (dense, the
// input's dtype), kernels only fill them; float32 and float64.
#pragma once

#include <cstdint>

#include "core/error.h"   // defines: LOOM_CHECK
#include "core/tensor.h"  // defines: Tensor

namespace loom::cpu {

// The error a CPU-only op gives for a tensor elsewhere. See Note [CPU-only kernels outside the dispatch table].
inline void require_cpu(const char* op, const Tensor& t) {
  LOOM_CHECK(!t.defined() || t.device().is_cpu(), op, ": not implemented on CUDA yet (the op has a CPU kernel "
             "only), got a tensor on ", t.device(), "; run it on the CPU");
}

// ---- layer norm ---------------------------------------------------------------------------
// x: [rows, cols] (any strides); weight, bias: [cols] or undefined. Writes out [rows, cols]
// and the per-row mean and rstd = 1 / sqrt(biased var + eps) ([rows]), which backward reads.
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, Tensor& out,
                        Tensor& mean, Tensor& rstd);
// Fills whichever of grad_x ([rows, cols]), grad_weight and grad_bias ([cols]) are defined.
void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, Tensor& grad_x, Tensor& grad_weight, Tensor& grad_bias);

// ---- GELU -----------------------------------------------------------------------------------
// tanh_approximation: PyTorch's approximate="tanh"; otherwise the exact x * Phi(x).
void gelu_forward(const Tensor& x, bool tanh_approximation, Tensor& out);
void gelu_backward(const Tensor& grad_out, const Tensor& x, bool tanh_approximation, Tensor& grad_x);

// ---- fused attention ------------------------------------------------------------------------
// Rows of queries and of keys handled at once: Note [Flash attention on the CPU]
// (core/cpu/attention.cpp). The defaults suit head dims of 32 to 128; tests pass small
// blocks so that a few tokens already span several.
struct AttentionBlocks {
  int64_t query = 64;
  int64_t key = 128;
};

// q [N, L, E], k [N, S, E], v [N, S, Ev] (any strides); mask: undefined, or an additive
// mask of q's dtype with shape [*batch, L, S], prod(batch) = N, and any strides (a
// broadcast [L, S] or [B, 1, L, S] mask is an expand()ed view, never copied). is_causal masks key j > query i. Writes out [N, L, Ev] and
// lse [N, L], each row's log-sum-exp of its scaled, masked scores (+inf for a row whose
// every key is masked: its output is NaN, as softmax over nothing is).
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                             double scale, Tensor& out, Tensor& lse, AttentionBlocks blocks = {});
// Recomputes the probabilities from q, k, lse block by block; fills grad_q, grad_k, grad_v
// (all three, dense, the shapes of q, k, v).
void flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& mask, bool is_causal, double scale, const Tensor& out, const Tensor& lse,
                              Tensor& grad_q, Tensor& grad_k, Tensor& grad_v, AttentionBlocks blocks = {});

}  // namespace loom::cpu
