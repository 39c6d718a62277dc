// WorkerPool: N threads producing numbered results ahead of a consumer that takes them
// strictly in order. The DataLoader's engine; it knows nothing about datasets.
//
// Note [In-order prefetch]
// A pass has `count` tasks, 0..count-1. Workers claim the lowest unclaimed task, but
// only while it is fewer than `capacity` tasks ahead of the consumer (capacity =
// num_workers * prefetch_factor in the DataLoader), so memory stays bounded however
// slow the consumer is. Task t's result goes to slot t % capacity; that slot is free
// because task t - capacity was consumed before t could be claimed. The consumer waits
// on the slot of the next task in order, so results come out in task order whichever
// worker finishes first. A task's exception travels in its slot and is rethrown by
// next() for that task, in order, exactly where a single-threaded loop would throw it.
//
// Cancelling (a new pass, an abandoned pass, the destructor) stops new claims, waits for
// tasks in flight to finish, and drops their results: nothing keeps running against a
// pass that no longer exists, and nothing hangs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"  // defines: Batch, what tasks produce

namespace loom::data {

class WorkerPool {
 public:
  // task -> result, run on worker thread `worker` (0-based).
  using Producer = std::function<Batch(int64_t task, int64_t worker)>;

  // Beyond these, a request is a mistake (and a thread or an allocation that fails).
  static constexpr int64_t kMaxWorkers = 1024;
  static constexpr int64_t kMaxCapacity = int64_t(1) << 20;

  WorkerPool(int64_t num_workers, int64_t capacity);
  ~WorkerPool();  // cancels the pass and joins every thread
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Starts a pass of `count` tasks, cancelling any unfinished one first.
  void start(int64_t count, Producer produce);
  // The result of the next task in order; blocks until it is ready. Rethrows the task's
  // exception. Calling it past the last task is a loom::Error.
  Batch next();
  // Stops the current pass: see Note [In-order prefetch].
  void cancel();
  int64_t num_workers() const { return static_cast<int64_t>(threads_.size()); }

 private:
  struct Slot {
    int64_t task = -1;  // which task's result this holds; -1 when empty
    Batch result;
    std::exception_ptr error;
  };
  void run(int64_t worker);
  bool can_claim() const { return next_claim_ < count_ && next_claim_ < next_consume_ + capacity_; }

  const int64_t capacity_;
  std::mutex mutex_;
  std::condition_variable work_ready_;    // workers wait here for a claimable task
  std::condition_variable result_ready_;  // the consumer (and cancel) wait here
  Producer produce_;
  int64_t count_ = 0, next_claim_ = 0, next_consume_ = 0, in_flight_ = 0;
  uint64_t pass_ = 0;  // bumped by cancel(), so late results of an old pass are dropped
  bool stopping_ = false;
  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
};

}  // namespace loom::data
