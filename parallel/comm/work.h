// Work: the handle of one asynchronous communication operation.
//
//   auto work = comm.all_reduce(grad);   // returns at once; the transfer runs elsewhere
//   compute_next_layer();                // overlaps with the transfer
//   work->wait();                        // grad now holds the sum; throws if the op failed
//
// As torch.distributed's Work: wait() blocks until the operation finished and rethrows
// its error (a timeout, a peer that crashed, ranks that disagree on shapes);
// is_completed() asks without blocking. Until wait() returns, the tensors handed to the
// operation belong to it: reading them gives partial results, writing them corrupts
// the result.
//
// wait() itself has no timeout: the operation has one (see Note [Nothing hangs
// forever] in communicator.h), and it finishes the Work when it expires.
//
// Backends whose operations run on a GPU stream (NCCL) subclass Work: their wait()
// orders the caller's current stream after the operation instead of blocking the host,
// as PyTorch's ProcessGroupNCCL; synchronize() blocks the host. See Note [NCCL streams]
// in nccl_communicator.h. For host-side backends (Gloo) the two are the same.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>

namespace loom::distributed {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  virtual bool is_completed() const;
  // Completed without error (false while still running).
  bool is_success() const;
  // Blocks until the operation finished; rethrows its error, every time it is called.
  // (GPU backends: makes the current stream wait for it instead; see above.)
  virtual void wait() const;
  // Blocks the host until the operation finished; rethrows its error.
  virtual void synchronize() const { Work::wait(); }
  // "all_reduce #3 (sum) of float32 [4, 3] on rank 1 of 2": what this Work is for.
  const std::string& description() const { return description_; }
  // When the backend finished it (steady clock); meaningful once is_completed(). Lets a
  // tracer draw the operation's true extent after the fact (DDP's bucket spans).
  std::chrono::steady_clock::time_point completed_at() const;

  // Backends: mark the operation finished, with its error if it failed. Exactly once.
  void finish(std::exception_ptr error = nullptr);

  // Whether a thread has blocked in wait() (or synchronize()) before the operation
  // finished: the caller has nothing left to do but wait, so its core is free. Backends
  // may give a callback that the first such wait() runs, under this Work's lock, to
  // wake a helper (Note [Whoever waits reduces], shm_collectives.h); null removes it,
  // and once that call returns the callback is never run again.
  bool awaited() const;
  void on_awaited(std::function<void()> callback);

 private:
  const std::string description_;
  mutable std::mutex mutex_;
  mutable std::condition_variable done_cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point completed_at_{};
  std::exception_ptr error_;
  mutable bool awaited_ = false;
  std::function<void()> on_awaited_;
};

}  // namespace loom::distributed
