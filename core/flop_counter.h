// FlopCounterMode: what a piece of work costs, counted instead of timed, as PyTorch's
// torch.utils.flop_counter.FlopCounterMode.
//
//   FlopCounterMode counter;            // counts on this thread while alive
//   Tensor y = layer(x);
//   counter.total_flops();              // 2·M·N·K per matrix product, the same per convolution
//   counter.allocated_bytes();          // bytes of every tensor storage made meanwhile
//
// Note [Counted, not timed]
// A measured time changes with the machine's load from one run, and one process, to the
// next; a count of floating-point operations and bytes depends only on the shapes. That
// is what makes a cost model that every rank computes alike (Note [Balance by a cost
// model], parallel/balance.h). FLOPs are counted where the arithmetic is dense enough to
// dominate (convolutions and matrix products, as PyTorch's counter does); the cost of
// every other op (normalisation, activations, pooling, adds) is the memory it streams,
// which the bytes of the storage it allocates for its output stand for.
//
// Counting is per thread (a thread_local pointer): work on other threads (another
// rank's, a loader's) is never counted, and no lock is taken. Counters nest: an inner
// one counts alone until it ends, then the outer one resumes.
#pragma once

#include <cstdint>

namespace loom {

class FlopCounterMode {
 public:
  FlopCounterMode();
  ~FlopCounterMode();
  FlopCounterMode(const FlopCounterMode&) = delete;
  FlopCounterMode& operator=(const FlopCounterMode&) = delete;

  int64_t total_flops() const { return flops_; }  // PyTorch: get_total_flops()
  int64_t allocated_bytes() const { return bytes_; }

  // Called by the ops (conv2d, mm, bmm, linear) and by storage allocation; no-ops
  // unless a counter is alive on this thread.
  static void add_flops(int64_t flops);
  static void add_allocation(int64_t bytes);

 private:
  int64_t flops_ = 0;
  int64_t bytes_ = 0;
  FlopCounterMode* outer_ = nullptr;
};

}  // namespace loom
