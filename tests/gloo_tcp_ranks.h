// The ranks of a gloo test over TCP (tests/test_comm_gloo.cpp, test_comm_gloo_errors.cpp):
// each a thread with its own TCPStore client and GlooCommunicator, shared memory off.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "parallel/comm/gloo_communicator.h"
#include "rank_threads.h"  // defines: run_rank_threads

namespace loom::testing {

using namespace std::chrono_literals;

// Runs body(comm) on `n` ranks, one thread each, over Gloo's own TCP collectives
// (tests/test_comm_shm.cpp tests the shared-memory path); `groups` communicators per rank
// in turn. Returns each rank's error ("" if none).
inline std::vector<std::string> run_tcp_ranks(int n, const std::function<void(distributed::Communicator&)>& body,
                                              std::chrono::milliseconds timeout = 10s, int groups = 1,
                                              bool verify_collectives = true) {
  return loom::testing::run_rank_threads(n, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    distributed::GlooOptions options;
    options.timeout = timeout;
    options.verify_collectives = verify_collectives;
    options.shared_memory = false;
    for (int g = 0; g < groups; ++g) {
      distributed::GlooCommunicator comm(store, "group" + std::to_string(g), r, n, options);
      body(comm);
    }
  });
}

}  // namespace loom::testing
