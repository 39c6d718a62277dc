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
//
// Note [Interleaved 1F1B: virtual stages]
// Megatron-LM's interleaved schedule (PyTorch's ScheduleInterleaved1F1B): the model is
// cut into S·V virtual stages and stage s (a device, or a rank) holds V of them, the
// non-adjacent virtual stages s, s + S, s + 2S, ...: its local stages v = 0 .. V-1 are
// the model's virtual stages v·S + s (virtual_stage()). With V = 1 virtual stage s is
// stage s. A micro-batch goes round the stages V times. Each action is one virtual
// stage's forward or backward, 1/V of a stage's work, and the pipeline fills after S - 1
// such short actions instead of S - 1 whole stages: the bubble is (S - 1) / (V·M + S - 1)
// of the time instead of (S - 1) / (M + S - 1), for V times as many (smaller) messages
// between stages. Stage s's order, as Megatron's:
//   forwards:  micro-batches in groups of S; for each group, local stage v = 0 .. V-1,
//              each micro-batch of the group (the last group may be smaller when S does
//              not divide M);
//   backwards: the same groups, local stages v = V-1 .. 0;
//   warm-up:   min(2·(S - 1 - s) + (V - 1)·S, V·M) forwards (all of them when M = S,
//              Megatron's rule), then one forward one backward, then the backwards.
// Every virtual stage still runs its backwards in micro-batch order, so the gradients are
// bitwise GPipe's. Every stage runs its forwards (and its backwards) in the same order of
// (local stage, micro-batch), so the messages rank s sends to rank s + 1 come in the
// order rank s + 1 receives them: a cross-process pipeline can match them by call order
// (pipeline_stage.h). With V = 1 the order is 1F1B's.
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
  // Which of the stage's V virtual stages, 0 .. V-1 (its local stage; always 0 but in
  // interleaved schedules): local stage v of stage s is the model's virtual stage v·S + s.
  int64_t local_stage = 0;
  bool operator==(const Action&) const = default;
};

// ticks[t][s]: what stage s does at tick t; nullopt while it waits (the bubble).
struct Schedule {
  int64_t stages = 0, micro_batches = 0;
  int64_t virtual_stages = 1;  // V: virtual stages per stage (Note [Interleaved 1F1B: virtual stages])
  std::vector<std::vector<std::optional<Action>>> ticks;
};

// The model's virtual stage (0 .. S·V - 1) that local stage v of stage s is.
inline int64_t virtual_stage(int64_t stage, int64_t local_stage, int64_t stages) {
  return local_stage * stages + stage;
}

// Each stage's own order of actions (Note [Schedules are local orders placed on a clock]).
std::vector<std::vector<Action>> gpipe_order(int64_t stages, int64_t micro_batches);
std::vector<std::vector<Action>> one_f_one_b_order(int64_t stages, int64_t micro_batches);
std::vector<std::vector<Action>> interleaved_1f1b_order(int64_t stages, int64_t micro_batches, int64_t virtual_stages);

// Places per-stage orders on ticks: each stage runs its next action as soon as what it
// needs finished at an earlier tick: the forward of virtual stage c needs c - 1's, the
// backward of c needs c + 1's (the last virtual stage: its own forward). A
// loom::Error if the orders can never finish (an action waits for one that comes later
// in another stage's order).
Schedule place_on_clock(const std::vector<std::vector<Action>>& orders, int64_t micro_batches,
                        int64_t virtual_stages = 1);

Schedule gpipe_schedule(int64_t stages, int64_t micro_batches);
Schedule one_f_one_b_schedule(int64_t stages, int64_t micro_batches);
Schedule interleaved_1f1b_schedule(int64_t stages, int64_t micro_batches, int64_t virtual_stages);
// "gpipe", "1f1b" or "interleaved_1f1b"; anything else is a loom::Error naming them.
// virtual_stages must be 1 but for interleaved_1f1b.
Schedule make_schedule(const std::string& name, int64_t stages, int64_t micro_batches, int64_t virtual_stages = 1);
// Whether `name` is a schedule make_schedule knows; a loom::Error naming them if not.
void check_schedule_name(const std::string& name);

// One row per stage: "F3", "B0", "." for idle, in columns of equal width; interleaved
// schedules name the local stage too ("F3a", "B0b": local stage a = 0, b = 1, ...).
std::string draw(const Schedule& schedule);
// The most (micro-batch, virtual stage) activations stage s holds at once (forwarded,
// not yet backwarded).
int64_t peak_activations(const Schedule& schedule, int64_t stage);
// Idle stage-ticks over all stage-ticks.
double bubble_fraction(const Schedule& schedule);

}  // namespace loom::parallel::pipeline
