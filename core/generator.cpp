#include "core/generator.h"

namespace loom {

void Generator::manual_seed(uint64_t seed) { set_state(seed, 0); }

uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offset_;
}

void Generator::set_state(uint64_t seed, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = offset;
}

uint64_t Generator::reserve(uint64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t first = offset_;
  offset_ += count;
  return first;
}

namespace {
thread_local Generator* t_replay = nullptr;  // See Note [A recomputation draws its random numbers again]
}  // namespace

Generator& default_generator() {
  static Generator generator;
  return t_replay ? *t_replay : generator;
}

ReplayRandomScope::ReplayRandomScope(uint64_t seed, uint64_t offset) : generator_(seed), outer_(t_replay) {
  generator_.set_state(seed, offset);
  t_replay = &generator_;
}

ReplayRandomScope::~ReplayRandomScope() { t_replay = outer_; }

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace loom
