// Shape-only runs: every kernel that computes becomes a no-op while the allocator keeps its
// books, so a training step can be run for what it allocates, not for what it computes.
//
//   {
//     loom::ShapeOnlyGuard shape_only;          // from here, in every thread of the process
//     Tensor y = conv(x);                       // y has its shape, dtype, device and memory...
//     loss.backward();                          // ...but no kernel wrote a byte of it
//   }
//   loom::max_memory_allocated(Device("cpu:1"));  // the step's peak, as a real run's
//
// Note [Shape-only runs]
// What a step allocates depends on shapes, dtypes and the order of operations, never on
// the values: every output is allocated by the caller (core/kernels.h: "kernels only fill
// it"), so skipping the kernels leaves the allocation sequence, and with it the caching
// allocator's statistics and peaks, exactly as a real step's. That is how train_cifar10
// --estimate-memory predicts each rank's peak in seconds (train/estimate_memory.h).
//
// - The switch is process-wide, not per thread: pipeline stages, DataParallel replicas,
//   DataLoader workers and OpenMP teams run on threads of their own and must all skip
//   arithmetic. Turn it on before starting the work it covers. It counts its guards, so
//   that ranks run as threads of one process (the memory estimator's advice) can each hold
//   one: the switch stays on until the last of them ends, not the first.
// - DispatchStub::operator() (core/dispatch.h) hands out a no-op of the kernel's
//   signature while it is on; kernels return void (they fill outputs), so nothing else
//   changes for the caller.
// - Copies and fills still run (DispatchStub::moves_bytes_only): they compute nothing,
//   and the small tensors that carry metadata travel through them: a pipeline's status
//   all-reduce, counts moved to the communicator's device, a zero-filled flag. Without
//   them a rank would read garbage where it expects a shape or a verdict.
// - Collectives still run: they move bytes between ranks, so ranks stay in step, each
//   allocates its own communication buffers, and the shared-memory blocks count as in
//   training. Skipping them would need every backend to fake its results.
// - Memory a kernel would have written is allocated but not written: a large block comes
//   from mmap and its pages stay untouched until a copy writes them.
// - Computed values are garbage. Code that branches on them (a loss printed, a gradient
//   norm) runs on garbage; a GradScaler's inf flag stays at the zero it was filled with,
//   so no step is skipped. The estimator drives the step itself and reads nothing back.
//   Work outside the stubs still happens: the collectives' reductions, the data loader's
//   reads, and the transformer kernels autograd calls directly (core/cpu/transformer_kernels.h).
// - What it cannot see: memory a kernel allocates for itself is not allocated when the
//   kernel does not run: a convolution's workspace and oneDNN's scratchpad (on `cpu`), and
//   the float32 staging of float16 tensors on the CPU (on the tensors' own device).
#pragma once

#include <atomic>

namespace loom {

namespace detail {
// One count for the process (an inline variable is one object across libloom and the
// programs that include this header): the guards alive now, in any thread.
inline std::atomic<int> shape_only_guards{0};
}  // namespace detail

// Whether kernels are skipped now (Note [Shape-only runs]).
inline bool shape_only() { return detail::shape_only_guards.load(std::memory_order_relaxed) > 0; }

// Skips every kernel, in every thread, for its lifetime (and for as long as any other
// guard lives).
class ShapeOnlyGuard {
 public:
  ShapeOnlyGuard() { detail::shape_only_guards.fetch_add(1); }
  ~ShapeOnlyGuard() { detail::shape_only_guards.fetch_sub(1); }
  ShapeOnlyGuard(const ShapeOnlyGuard&) = delete;
  ShapeOnlyGuard& operator=(const ShapeOnlyGuard&) = delete;
};

}  // namespace loom
