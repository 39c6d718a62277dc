// The arithmetic of loom's host collectives: one reduction kernel that the gloo
// backend's TCP path (as Gloo's reduction callback) and its shared-memory path
// (shm_collectives.h) both run, so that every dtype the backend reduces, and the order
// it reduces in, is defined in one place.
//
//   reduce(kFloat32, {out0, out1}, {in0, in1, in2}, n, ReduceOp::Sum, /*world=*/3);
//   opts.setReduceFunction(pairwise_reduce(kFloat16, ReduceOp::Max));  // for gloo::allreduce
//
// Note [Which dtypes the gloo backend reduces]
// As PyTorch's gloo backend: float32, float64, float16, bfloat16, int32, int64 and uint8
// (uint8 sums wrap modulo 256, as in PyTorch). Operations that only move bytes
// (broadcast, all_gather, send, recv) take every dtype, bool included. 16-bit floats
// are reduced in float32 and rounded once per result in the shared-memory path, which
// sums all ranks' values before rounding; Gloo's TCP ring adds one rank at a time, so
// there each partial sum is rounded (as in PyTorch, whose gloo reduces float16 pairwise
// in the same way). On 2 ranks the two agree bitwise; on more, within the rounding of
// the 16-bit type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "parallel/comm/op.h"

namespace loom::distributed {

// Whether reduce() takes this dtype; see Note [Which dtypes the gloo backend reduces].
bool is_reducible(DType dtype);
// "float32, float64, float16, bfloat16, int32, int64 and uint8", for error messages.
const char* reducible_dtype_names();

// Every dsts[d][i] = op over srcs[s][i] for i < n, the sources taken in order (Avg
// divides the sum by `world`; it takes floating dtypes only). A destination may also be
// a source: each block of sources is read before anything is written. Results are
// bitwise the same whoever runs it, whatever the destinations.
void reduce(DType dtype, std::span<uint8_t* const> dsts, std::span<const uint8_t* const> srcs, size_t n,
            ReduceOp op, int world);

// Gloo's reduction callback: c[i] = a[i] op b[i] for n elements of `dtype`. Avg reduces
// as Sum (the caller divides once at the end).
using PairwiseReduce = void (*)(void* c, const void* a, const void* b, size_t n);
PairwiseReduce pairwise_reduce(DType dtype, ReduceOp op);

}  // namespace loom::distributed
