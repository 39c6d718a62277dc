#include "parallel/device_threads.h"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "autograd/autocast.h"   // defines: autocast::Guard, is_enabled, get_dtype
#include "core/memory.h"         // defines: OutOfMemoryError (kept as such, for the trainer's advice)
#include "autograd/grad_mode.h"  // defines: GradMode
#include "cuda/device.h"         // defines: cuda::DeviceGuard

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

CallerState CallerState::capture(size_t sharing) {
  CallerState state;
  state.grad_enabled = GradMode::is_enabled();
  state.autocast_cpu = autocast::is_enabled(DeviceType::CPU);
  state.autocast_cuda = autocast::is_enabled(DeviceType::CUDA);
  state.autocast_cpu_dtype = autocast::get_dtype(DeviceType::CPU);
  state.autocast_cuda_dtype = autocast::get_dtype(DeviceType::CUDA);
  state.threads_each = std::max(1, omp_get_max_threads() / static_cast<int>(std::max<size_t>(sharing, 1)));
  return state;
}

struct DeviceScope::Guards {
  std::optional<autocast::Guard> cpu, cuda;
  std::optional<cuda::DeviceGuard> device;
};

DeviceScope::DeviceScope(const CallerState& state, Device device)
    : previous_grad_(GradMode::is_enabled()), previous_threads_(omp_get_max_threads()), guards_(new Guards) {
  GradMode::set_enabled(state.grad_enabled);
  omp_set_num_threads(state.threads_each);
  if (state.autocast_cpu) guards_->cpu.emplace(DeviceType::CPU, state.autocast_cpu_dtype);
  if (state.autocast_cuda) guards_->cuda.emplace(DeviceType::CUDA, state.autocast_cuda_dtype);
  if (device.is_cuda()) guards_->device.emplace(device.index);
}

DeviceScope::~DeviceScope() {
  guards_.reset();  // autocast scopes close before grad mode and threads come back
  omp_set_num_threads(previous_threads_);
  GradMode::set_enabled(previous_grad_);
}

void run_on_device_threads(size_t n, const std::function<void(size_t)>& task) {
  if (n == 0) return;
  DeviceThreads::instance().run(n, task);
}

void rethrow_first_error(const std::vector<std::exception_ptr>& errors,
                         const std::function<std::string(size_t)>& describe) {
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const OutOfMemoryError& e) {  // still an out-of-memory error: callers act on it
      throw OutOfMemoryError(loom::detail::str(describe(i), ": ", e.what()));
    } catch (const std::exception& e) {
      LOOM_FAIL(describe(i), ": ", e.what());
    }
  }
}

}  // namespace loom::parallel
