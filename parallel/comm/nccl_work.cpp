// NcclWork; see nccl_work.h and Note [NCCL streams] in nccl_communicator.h.
#include "parallel/comm/nccl_work.h"

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace loom::distributed {

NcclWork::NcclWork(std::string description, int device, Deadline deadline, bool blocking_wait)
    : Work(std::move(description)), device_(device), deadline_(deadline), blocking_wait_(blocking_wait) {}

void NcclWork::finish_once(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finishing_) return;
    finishing_ = true;
  }
  finish(std::move(error));
}

bool NcclWork::poll() {
  if (Work::is_completed()) return true;
  try {
    if (done_.query()) finish_once(nullptr);
  } catch (const std::exception&) {  // the device failed under us: that is this op's error too
    finish_once(std::current_exception());
  }
  return Work::is_completed();
}

void NcclWork::fail(std::exception_ptr error) { finish_once(std::move(error)); }

// Completion is discovered by polling, so asking may finish the Work: logically const.
bool NcclWork::is_completed() const { return const_cast<NcclWork*>(this)->poll(); }

void NcclWork::wait() const {
  if (blocking_wait_) return synchronize();
  if (is_completed()) return Work::wait();  // returns at once; rethrows a failure
  done_.wait(cuda::current_stream(device_));
}

void NcclWork::synchronize() const {
  // Short sleeps that grow to 1 ms: quick for small ops, cheap for long ones. The
  // watchdog fails the Work at its deadline, which ends this loop too.
  auto pause = std::chrono::microseconds(20);
  while (!is_completed()) {
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
  }
  Work::wait();
}

}  // namespace loom::distributed
