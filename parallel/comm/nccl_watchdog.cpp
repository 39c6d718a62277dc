// NcclCommunicator's watchdog: see Note [NCCL timeouts and the watchdog] in
// nccl_communicator.h. This file makes no NCCL call itself (async_error and
// fail_communicator, in nccl_communicator.cpp, do), so it includes no NCCL header.
#include <algorithm>

#include "core/error.h"
#include "parallel/comm/nccl_communicator.h"
#include "parallel/comm/nccl_work.h"

namespace loom::distributed {

// How often outstanding operations are polled. Only timeouts and releasing finished
// Works depend on it: is_completed() and synchronize() poll their own event.
constexpr auto kWatchdogPeriod = std::chrono::milliseconds(10);

void NcclCommunicator::track(std::shared_ptr<NcclWork> work) {
  {
    std::lock_guard<std::mutex> lock(works_mutex_);
    outstanding_.push_back(work);
  }
  works_cv_.notify_one();
  // An abort between this op's enqueue and now did not see it: its kernel was cut short,
  // so its event passing would not mean success.
  if (std::string why = failure(); !why.empty())
    work->fail(std::make_exception_ptr(Error(detail::str(work->description(), " failed: the NCCL communicator was "
                                                         "aborted because ", why))));
}

// Runs until the communicator is destroyed *and* nothing is outstanding: a destructor
// waits here for in-flight operations, each bounded by its deadline.
void NcclCommunicator::watchdog_loop() {
  std::unique_lock<std::mutex> lock(works_mutex_);
  while (true) {
    works_cv_.wait(lock, [&] { return stopping_ || !outstanding_.empty(); });
    if (outstanding_.empty()) return;  // stopping, and nothing left
    std::vector<std::shared_ptr<NcclWork>> works = outstanding_;
    lock.unlock();
    watchdog_check(works);  // polls events (CUDA calls) and may abort: without the lock
    works.clear();
    lock.lock();
    std::erase_if(outstanding_, [](const std::shared_ptr<NcclWork>& w) { return w->Work::is_completed(); });
    if (!outstanding_.empty()) works_cv_.wait_for(lock, kWatchdogPeriod);
  }
}

void NcclCommunicator::watchdog_check(const std::vector<std::shared_ptr<NcclWork>>& works) {
  const auto now = std::chrono::steady_clock::now();
  const NcclWork* oldest_running = nullptr;
  for (const auto& work : works) {
    if (work->poll()) continue;
    if (oldest_running == nullptr) oldest_running = work.get();
    if (now >= work->deadline()) {
      fail_communicator(detail::str(work->description(), " failed: timed out after ", timeout().count(),
                                    " ms on cuda:", device_, ": the NCCL operation did not complete. Another rank "
                                    "did not reach this operation in time: it may have crashed, be stuck or slower "
                                    "than the timeout, or be calling operations in a different order. Check the "
                                    "other ranks' output"),
                        work.get());
      return;
    }
  }
  if (oldest_running == nullptr) return;
  if (std::string error = async_error(); !error.empty())
    fail_communicator(detail::str(oldest_running->description(), " failed: ", error), oldest_running);
}

}  // namespace loom::distributed
