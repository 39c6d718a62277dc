// The "a rank that never arrives" case every communicator backend's tests run
// (test_comm_gloo, test_comm_shm, test_comm_nccl): rank 1 stays away for `absent_for`
// without calling anything; rank 0's all_reduce must fail by its timeout (Note [Nothing
// hangs forever], communicator.h) naming the op, its number, shape and rank, and the
// next operation must fail at once naming the first failure.
//
//   NeverArrives seen;
//   require_no_errors(run_ranks(2, [&](Communicator& comm) { seen.run(comm, 1500ms, {}); }, 700ms));
//   seen.check(700ms, "waiting for rank 1");
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/factory.h"
#include "parallel/comm/communicator.h"

namespace loom::testing {

struct NeverArrives {
  std::string first, second;  // rank 0's two errors
  double seconds = 0;         // how long the first took to fail

  void run(distributed::Communicator& comm, std::chrono::milliseconds absent_for, TensorOptions options) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(absent_for);  // never calls all_reduce
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.all_reduce(zeros({3, 2}, options))->wait();
    } catch (const Error& e) {
      first = e.what();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    try {
      comm.all_reduce(zeros({1}, options))->wait();
    } catch (const Error& e) {
      second = e.what();
    }
  }

  // `timeout` is the communicator's; `why` is what the backend says of rank 1.
  void check(std::chrono::milliseconds timeout, const std::string& why, double at_most_seconds) const {
    CAPTURE(first);
    CHECK(seconds >= 0.8 * double(timeout.count()) / 1000);
    CHECK(seconds < at_most_seconds);
    CHECK(first.find(detail::str("all_reduce #0 (sum) of float32 [3, 2] on rank 0 of 2 failed: timed out after ",
                                 timeout.count(), " ms")) != std::string::npos);
    CHECK(first.find(why) != std::string::npos);
    CAPTURE(second);
    CHECK(second.find("all_reduce #1 (sum) of float32 [1] on rank 0 of 2 was not run") != std::string::npos);
    CHECK(second.find("failed earlier") != std::string::npos);
  }
};

}  // namespace loom::testing
