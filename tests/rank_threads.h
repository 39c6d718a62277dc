// Multi-rank tests in one process: each rank is a thread with its own TCPStore client and
// GlooCommunicator. Collectives go through shared memory (the ranks share a host), or
// over real TCP on 127.0.0.1 with shared_memory = false (as tests/test_comm_gloo.cpp).
//
//   auto errors = run_ranks(2, [&](std::shared_ptr<Communicator> comm) { ... });
//   require_no_errors(errors);
//
// Everything a rank needs that involves randomness (models, data) should be made on the
// main thread before run_ranks: the default generator is shared by all threads.
#pragma once

#include <doctest/doctest.h>
#include <omp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/gloo_communicator.h"
#include "parallel/store/tcp_store.h"
#include "tensor_compare.h"  // defines: max_abs_diff

namespace loom::testing {

using namespace std::chrono_literals;

// The skeleton of every multi-rank test: n threads, each with its own TCPStore client of
// one server (rank 0 uses the server itself); body(rank, store) builds that rank's
// communicator(s) and runs. An exception becomes that rank's error ("" if none).
inline std::vector<std::string> run_rank_threads(
    int n, const std::function<void(int, std::shared_ptr<distributed::TCPStore>)>& body) {
  auto server = std::make_shared<distributed::TCPStore>("127.0.0.1", 0, /*is_server=*/true, 20s);
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, r == 0 ? server : std::make_shared<distributed::TCPStore>("127.0.0.1", server->port(), false, 20s));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Runs body(comm) on n ranks, one thread each; returns each rank's error ("" if none).
// Collectives time out after `timeout`, so a test that goes wrong fails instead of hanging.
inline std::vector<std::string> run_ranks(int n,
                                          const std::function<void(std::shared_ptr<distributed::Communicator>)>& body,
                                          std::chrono::milliseconds timeout = 20s, bool shared_memory = true) {
  return run_rank_threads(n, [&](int r, std::shared_ptr<distributed::TCPStore> store) {
    omp_set_num_threads(1);  // n ranks share this machine's cores, as n processes would
    distributed::GlooOptions options;
    options.timeout = timeout;
    options.shared_memory = shared_memory;
    body(std::make_shared<distributed::GlooCommunicator>(store, "ranks", r, n, options));
  });
}

inline void require_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) FAIL("rank ", r, ": ", errors[r]);
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace loom::testing
