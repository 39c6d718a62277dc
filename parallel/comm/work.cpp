#include "parallel/comm/work.h"

#include "core/error.h"

namespace loom::distributed {

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool Work::is_success() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ && !error_;
}

void Work::wait() const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_ && !awaited_) {
    awaited_ = true;
    if (on_awaited_) on_awaited_();
  }
  done_cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool Work::awaited() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return awaited_;
}

void Work::on_awaited(std::function<void()> callback) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_awaited_ = std::move(callback);
}

std::chrono::steady_clock::time_point Work::completed_at() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_at_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_CHECK(!done_, "Work::finish called twice for ", description_, " (a backend bug)");
    done_ = true;
    completed_at_ = std::chrono::steady_clock::now();
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace loom::distributed
