// BusyCores: a busy loop on every core while alive, the loaded machine of Note [Which tests
// depend on timing] (tests/test_balance.cpp), made inside a test: a run that must not
// depend on timing is repeated beside it.
#pragma once

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "process_launch.h"  // defines: Launch, Result

namespace loom::testing {

class BusyCores {
 public:
  BusyCores() {
    for (unsigned i = 0; i < std::max(2u, std::thread::hardware_concurrency()); ++i)
      threads_.emplace_back([this] {
        volatile double sink = 0;
        while (!stop_.load(std::memory_order_relaxed)) sink = sink + 1.0;
      });
  }
  ~BusyCores() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  BusyCores(const BusyCores&) = delete;
  BusyCores& operator=(const BusyCores&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Runs `idle`, then `busy` beside a busy loop on every core; each must succeed (a failed
// REQUIRE with its output otherwise). Their results, in that order.
inline std::pair<Result, Result> run_idle_then_busy(const std::string& idle, const std::string& busy) {
  Result first = Launch(idle).finish();
  REQUIRE_MESSAGE(first.code == 0, first.output);
  Result second;
  {
    BusyCores load;
    second = Launch(busy).finish();
  }
  REQUIRE_MESSAGE(second.code == 0, second.output);
  return {first, second};
}

}  // namespace loom::testing
