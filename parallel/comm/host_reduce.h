// The arithmetic of loom's host collectives: one reduction kernel that the gloo
// backend's TCP path (gloo_reduce_shares.cpp) and its shared-memory path
// (shm_collectives.h) both run, so that every dtype the backend reduces, and the order
// it reduces in, is defined in one place.
//
//   reduce(kFloat32, {out0, out1}, {in0, in1, in2}, n, ReduceOp::Sum, /*world=*/3);
//
// Note [Which dtypes the gloo backend reduces]
// As PyTorch's gloo backend: float32, float64, float16, bfloat16, int32, int64 and uint8
// (uint8 sums wrap modulo 256, as in PyTorch). Operations that only move bytes
// (broadcast, all_gather, send, recv) take every dtype, bool included. 16-bit floats
// are reduced in float32 and rounded once per result: every rank's values are summed
// before rounding, on both transports (PyTorch's gloo ring rounds each partial sum).
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

}  // namespace loom::distributed
