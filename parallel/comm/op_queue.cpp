#include "parallel/comm/op_queue.h"

#include "core/error.h"

namespace loom::distributed {

OpQueue::OpQueue() : thread_([this] { run(); }) {}

OpQueue::~OpQueue() {
  close("the communicator was destroyed before this operation started");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

static std::exception_ptr closed_error(const std::string& description, const std::string& reason) {
  return std::make_exception_ptr(Error(description + " was not run: " + reason));
}

void OpQueue::push(std::shared_ptr<Work> work, std::function<void()> job) {
  std::string refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_reason_.empty()) items_.push_back({work, std::move(job)});
    else refused = closed_reason_;
  }
  if (!refused.empty()) work->finish(closed_error(work->description(), refused));
  else wake_.notify_one();
}

bool OpQueue::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_job_ || !items_.empty();
}

void OpQueue::close(const std::string& reason) {
  std::deque<Item> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_reason_.empty()) closed_reason_ = reason;
    dropped.swap(items_);
  }
  for (auto& item : dropped) item.work->finish(closed_error(item.work->description(), reason));
}

void OpQueue::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !items_.empty(); });
    if (items_.empty()) return;  // stopping, and nothing left
    Item item = std::move(items_.front());
    items_.pop_front();
    running_job_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      item.job();
    } catch (...) {
      error = std::current_exception();
    }
    item.job = nullptr;  // release the job's tensors before the waiter wakes up
    item.work->finish(error);
    lock.lock();
    running_job_ = false;
  }
}

}  // namespace loom::distributed
