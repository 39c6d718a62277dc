#include "core/flop_counter.h"

namespace loom {

namespace {
thread_local FlopCounterMode* active = nullptr;  // See Note [Counted, not timed]: per thread
}  // namespace

FlopCounterMode::FlopCounterMode() : outer_(active) { active = this; }

FlopCounterMode::~FlopCounterMode() { active = outer_; }

void FlopCounterMode::add_flops(int64_t flops) {
  if (active != nullptr) active->flops_ += flops;
}

void FlopCounterMode::add_allocation(int64_t bytes) {
  if (active != nullptr) active->bytes_ += bytes;
}

}  // namespace loom
