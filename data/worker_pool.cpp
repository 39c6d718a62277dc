#include "data/worker_pool.h"

#include "core/error.h"

namespace loom::data {

WorkerPool::WorkerPool(int64_t num_workers, int64_t capacity) : capacity_(capacity) {
  // Checked before anything is allocated or started: a capacity of 2^40 slots would be
  // a bare std::bad_alloc.
  LOOM_CHECK(num_workers >= 1 && num_workers <= kMaxWorkers && capacity >= 1 && capacity <= kMaxCapacity,
             "WorkerPool: needs 1 to ", kMaxWorkers, " workers and 1 to ", kMaxCapacity, " batches in flight, got ",
             num_workers, " and ", capacity);
  slots_.resize(static_cast<size_t>(capacity));
  threads_.reserve(static_cast<size_t>(num_workers));
  try {
    for (int64_t w = 0; w < num_workers; ++w) threads_.emplace_back([this, w] { run(w); });
  } catch (...) {
    // The threads already started must be joined before they are destroyed, or the
    // process aborts: stop them, then say what the system refused.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    for (auto& thread : threads_) thread.join();
    try {
      throw;
    } catch (const std::exception& e) {
      LOOM_FAIL("DataLoader: could not start worker thread ", threads_.size() + 1, " of ", num_workers, ": ",
                e.what(), "; ask for fewer num_workers");
    }
  }
}

WorkerPool::~WorkerPool() {
  cancel();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& thread : threads_) thread.join();
}

void WorkerPool::cancel() {
  std::unique_lock<std::mutex> lock(mutex_);
  ++pass_;
  count_ = next_claim_ = next_consume_ = 0;
  result_ready_.wait(lock, [&] { return in_flight_ == 0; });
  for (auto& slot : slots_) slot = Slot{};
  produce_ = nullptr;
}

void WorkerPool::start(int64_t count, Producer produce) {
  cancel();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    produce_ = std::move(produce);
    count_ = count;
  }
  work_ready_.notify_all();
}

Batch WorkerPool::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  LOOM_CHECK(next_consume_ < count_, "WorkerPool::next: all ", count_, " tasks of this pass were already taken");
  const int64_t task = next_consume_;
  Slot& slot = slots_[static_cast<size_t>(task % capacity_)];
  result_ready_.wait(lock, [&] { return slot.task == task; });
  Slot taken = std::move(slot);
  slot = Slot{};
  ++next_consume_;
  lock.unlock();
  work_ready_.notify_all();  // the window moved: one more task may be claimed
  if (taken.error) std::rethrow_exception(taken.error);
  return std::move(taken.result);
}

void WorkerPool::run(int64_t worker) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_ready_.wait(lock, [&] { return stopping_ || can_claim(); });
    if (stopping_) return;
    const int64_t task = next_claim_++;
    const uint64_t pass = pass_;
    ++in_flight_;
    lock.unlock();

    Slot done;
    done.task = task;
    try {
      done.result = produce_(task, worker);  // produce_ is only replaced once in_flight_ is 0
    } catch (...) {
      done.error = std::current_exception();
    }

    lock.lock();
    --in_flight_;
    if (pass == pass_) slots_[static_cast<size_t>(task % capacity_)] = std::move(done);
    result_ready_.notify_all();
  }
}

}  // namespace loom::data
