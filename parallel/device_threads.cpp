#include "parallel/device_threads.h"

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::parallel {

namespace {

// See Note [Device threads persist].
class DeviceThreads {
 public:
  static DeviceThreads& instance() {
    static DeviceThreads threads;
    return threads;
  }
  ~DeviceThreads() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // task(0) on this thread, task(i) for 0 < i < n on worker thread i - 1; returns when
  // all are done. `task` must not throw.
  void run(size_t n, const std::function<void(size_t)>& task) {
    std::lock_guard<std::mutex> one_at_a_time(run_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (threads_.size() + 1 < n) threads_.emplace_back([this, w = threads_.size()] { loop(w); });
      task_ = &task;
      wanted_ = n - 1;
      pending_ = n - 1;
      ++generation_;
    }
    wake_.notify_all();
    task(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(size_t worker) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      if (worker >= wanted_) continue;  // this forward has fewer replicas than threads
      const std::function<void(size_t)>* task = task_;
      lock.unlock();
      (*task)(worker + 1);
      lock.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }

  std::mutex run_mutex_, mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(size_t)>* task_ = nullptr;
  size_t wanted_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace

void run_on_device_threads(size_t n, const std::function<void(size_t)>& task) {
  if (n == 0) return;
  DeviceThreads::instance().run(n, task);
}

}  // namespace loom::parallel
