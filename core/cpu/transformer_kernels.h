// The CPU kernels a transformer adds: layer norm, GELU and fused (flash) attention.
//
// Each is the CPU slot of a dispatch stub in core/kernels.h ("transformer kernels";
// the stubs are defined and registered at the end of layer_norm.cpp, gelu.cpp and
// attention.cpp), which is how the autograd ops call them (autograd/ops/layer_norm.cpp,
// gelu.cpp, attention.cpp); cuda/transformer.cu and cuda/attention.cu fill the CUDA slots.
// They are declared here as well so that tests can call the attention kernels with small
// blocks (AttentionBlocks), which the stub's signature does not carry.
//
// Conventions are core/kernels.h's: outputs are allocated by the caller (dense, the
// input's dtype), kernels only fill them; float32 and float64.
#pragma once

#include <cstdint>

#include "core/tensor.h"  // defines: Tensor

namespace loom::cpu {

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

// q [*batch, L, E], k [*batch, S, E], v [*batch, S, Ev], N = prod(batch), any strides
// (read in place where the last dim has stride 1: Note [Attention reads the heads in
// place], core/cpu/attention.cpp); mask: undefined, or an additive mask of q's dtype with
// shape [*batch, L, S] and any strides (a broadcast [L, S] or [B, 1, L, S] mask is an
// expand()ed view, never copied). is_causal masks key j > query i. Writes out
// [*batch, L, Ev] (any strides with a unit last stride) and lse [N, L], each row's
// log-sum-exp of its scaled, masked scores (+inf for a row whose every key is masked: its
// output is NaN, as softmax over nothing is).
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                             double scale, Tensor& out, Tensor& lse, AttentionBlocks blocks = {});
// Recomputes the probabilities from q, k, lse block by block; fills grad_q, grad_k, grad_v
// (all three, the shapes of q, k, v, any strides with a unit last stride).
void flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& mask, bool is_causal, double scale, const Tensor& out, const Tensor& lse,
                              Tensor& grad_q, Tensor& grad_k, Tensor& grad_v, AttentionBlocks blocks = {});

}  // namespace loom::cpu
