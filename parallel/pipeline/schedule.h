// Pipeline schedules as data: which stage runs which micro-batch's forward or backward
// at each clock tick. Pure functions of (stages, micro_batches), printable and tested
// without devices (torchgpipe's habit); parallel/pipeline/pipeline.h executes them.
//
//   auto s = one_f_one_b_schedule(/*stages=*/3, /*micro_batches=*/4);
//   std::puts(draw(s).c_str());
//   stage 0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3
//   stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .
//   stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .
//
// Note [Schedules are local orders placed on a clock]
// A schedule is first each stage's own order of actions; placing them on ticks is the
// same for every schedule: at each tick a stage runs its next action if what it needs
// finished at an earlier tick (the forward of micro-batch m on stage s needs m's forward
// on s - 1; its backward needs m's backward on s + 1, or, on the last stage, m's forward
// there, which also computes the loss). So the two schedules differ only in the local
// orders:
//   GPipe (fill, drain):   F0 F1 ... F(M-1) then B0 B1 ... B(M-1), on every stage. Every
//                          stage holds the activations of all M micro-batches at the end
//                          of the forwards.
//   1F1B (PipeDream-flush): stage s first runs min(S - 1 - s, M) forwards (warm-up), then
//                          alternates one forward and one backward, then finishes the
//                          backwards. Stage s never holds more than S - s micro-batches'
//                          activations, however large M is; the bubble is the same.
// Both run every stage's backwards in micro-batch order 0, 1, ..., so the gradients they
// accumulate are bitwise the same.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::parallel::pipeline {

enum class Pass : int8_t { Forward, Backward };

struct Action {
  Pass pass = Pass::Forward;
  int64_t micro_batch = 0;
  bool operator==(const Action&) const = default;
};

// ticks[t][s]: what stage s does at tick t; nullopt while it waits (the bubble).
struct Schedule {
  int64_t stages = 0, micro_batches = 0;
  std::vector<std::vector<std::optional<Action>>> ticks;
};

// Each stage's own order of actions (Note [Schedules are local orders placed on a clock]).
std::vector<std::vector<Action>> gpipe_order(int64_t stages, int64_t micro_batches);
std::vector<std::vector<Action>> one_f_one_b_order(int64_t stages, int64_t micro_batches);

// Places per-stage orders on ticks: each stage runs its next action as soon as what it
// needs finished at an earlier tick. A loom::Error if the orders can never finish (an
// action waits for one that comes later in another stage's order).
Schedule place_on_clock(const std::vector<std::vector<Action>>& orders, int64_t micro_batches);

Schedule gpipe_schedule(int64_t stages, int64_t micro_batches);
Schedule one_f_one_b_schedule(int64_t stages, int64_t micro_batches);
// "gpipe" or "1f1b"; anything else is a loom::Error naming both.
Schedule make_schedule(const std::string& name, int64_t stages, int64_t micro_batches);

// One row per stage: "F3", "B0", "." for idle, in columns of equal width.
std::string draw(const Schedule& schedule);
// The most micro-batches whose activations stage s holds at once (forwarded, not yet
// backwarded).
int64_t peak_activations(const Schedule& schedule, int64_t stage);
// Idle stage-ticks over all stage-ticks.
double bubble_fraction(const Schedule& schedule);

}  // namespace loom::parallel::pipeline
