// Grad mode: whether ops record the graph. Thread-local, as in PyTorch, so that one
// thread evaluating under NoGradGuard does not stop another thread's training.
#pragma once

namespace loom {

struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: no graph is recorded in this scope (optimizer steps, evaluation, backward itself).
class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGradGuard() { GradMode::set_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace loom
