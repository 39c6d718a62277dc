// OpQueue: one thread that runs a communicator's operations, one at a time, in order.
//
// Note [One worker thread per communicator]
// Gloo's collectives block the calling thread until the data has moved. Running them
// on a dedicated thread is what makes all_reduce return at once and lets the caller
// compute while gradients travel (DDP's overlap). One thread, not a pool: collectives
// must run in the same order on every rank, and a single FIFO thread keeps the order
// the caller issued them in without any further bookkeeping.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "parallel/comm/work.h"

namespace loom::distributed {

class OpQueue {
 public:
  OpQueue();
  // Fails every job that has not started (see close) and waits for the running one.
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Runs job on the worker thread after every job pushed before it; then finishes
  // work with the job's exception, if it threw.
  void push(std::shared_ptr<Work> work, std::function<void()> job);
  // True while a job runs or waits.
  bool busy() const;
  // From now on, queued and newly pushed jobs fail with `reason` instead of running.
  void close(const std::string& reason);

 private:
  void run();

  struct Item {
    std::shared_ptr<Work> work;
    std::function<void()> job;
  };
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Item> items_;
  bool running_job_ = false;
  bool stopping_ = false;
  std::string closed_reason_;
  std::thread thread_;
};

}  // namespace loom::distributed
