// NcclWork: the Work of one NCCL operation, finished by its completion event on the
// communication stream. See Note [NCCL streams] in nccl_communicator.h for what wait()
// and synchronize() mean here.
//
// Completion is discovered by polling: by the watchdog (which also fails the Work when
// its deadline passes or the communicator is aborted), and by is_completed() and
// synchronize() themselves, so that they never lag behind the watchdog's period. So
// completed_at() and is_success() (not virtual) tell what was last noticed: ask
// is_completed() first; completed_at() is when the host noticed, which may trail the
// GPU by up to the watchdog's period. The Work holds no pointer to its communicator, so
// it may outlive it.
#pragma once

#include <chrono>
#include <exception>
#include <mutex>
#include <string>

#include "cuda/device.h"  // defines: loom::cuda::Event (no CUDA header)
#include "parallel/comm/work.h"

namespace loom::distributed {

class NcclWork final : public Work {
 public:
  using Deadline = std::chrono::steady_clock::time_point;

  // blocking_wait: wait() blocks the host (barrier), as synchronize().
  NcclWork(std::string description, int device, Deadline deadline, bool blocking_wait);

  bool is_completed() const override;
  void wait() const override;
  void synchronize() const override;

  // The communicator's side.
  cuda::Event& done_event() { return done_; }  // recorded after the op, before the Work is shared
  Deadline deadline() const { return deadline_; }
  // Finishes the Work if its event has passed; true once it is finished (either way).
  bool poll();
  // Finishes the Work with `error` unless it finished already.
  void fail(std::exception_ptr error);

 private:
  void finish_once(std::exception_ptr error);

  cuda::Event done_;
  const int device_;
  const Deadline deadline_;
  const bool blocking_wait_;
  std::mutex finish_mutex_;  // poll() and fail() race: the watchdog against the caller
  bool finishing_ = false;
};

}  // namespace loom::distributed
