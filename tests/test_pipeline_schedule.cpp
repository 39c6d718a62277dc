// The pipeline schedules (parallel/pipeline/schedule.h) as data, without devices: their
// pictures, dependencies, activation memory and bubbles.
#include <doctest/doctest.h>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"

using namespace loom;
using namespace loom::parallel::pipeline;

namespace {

// Every action's dependency finished at an earlier tick, and every virtual stage (stage
// s's local stage v is virtual stage v·S + s) runs every micro-batch's forward and
// backward exactly once.
void check_valid(const Schedule& s) {
  const int64_t C = s.stages * s.virtual_stages;
  std::vector<std::vector<std::vector<int64_t>>> at(
      2, std::vector<std::vector<int64_t>>(size_t(C), std::vector<int64_t>(size_t(s.micro_batches), -1)));
  for (size_t t = 0; t < s.ticks.size(); ++t)
    for (int64_t st = 0; st < s.stages; ++st)
      if (const auto& a = s.ticks[t][size_t(st)]) {
        const int64_t c = virtual_stage(st, a->local_stage, s.stages);
        REQUIRE(at[size_t(a->pass)][size_t(c)][size_t(a->micro_batch)] == -1);
        at[size_t(a->pass)][size_t(c)][size_t(a->micro_batch)] = int64_t(t);
      }
  for (int64_t c = 0; c < C; ++c)
    for (int64_t m = 0; m < s.micro_batches; ++m) {
      const int64_t f = at[0][size_t(c)][size_t(m)], b = at[1][size_t(c)][size_t(m)];
      REQUIRE(f >= 0);
      REQUIRE(b > f);
      if (c > 0) CHECK(f > at[0][size_t(c) - 1][size_t(m)]);
      if (c + 1 < C) CHECK(b > at[1][size_t(c) + 1][size_t(m)]);
    }
}

// Each virtual stage runs its backwards in micro-batch order (so gradients accumulate in
// the same order under every schedule: bitwise the same).
void check_backward_order(const Schedule& s) {
  std::vector<int64_t> next(size_t(s.stages * s.virtual_stages), 0);
  for (const auto& row : s.ticks)
    for (int64_t st = 0; st < s.stages; ++st)
      if (const auto& a = row[size_t(st)]; a && a->pass == Pass::Backward)
        CHECK(a->micro_batch == next[size_t(virtual_stage(st, a->local_stage, s.stages))]++);
}

// The messages between each pair of neighbouring ranks, in the order the sender sends
// them and in the order the receiver receives them, are the same (a cross-process
// pipeline matches them by call order: Note [Interleaved 1F1B: virtual stages]).
void check_messages_in_order(const Schedule& s) {
  const int64_t S = s.stages, C = S * s.virtual_stages;
  // sent[pass][rank], received[pass][rank]: (the virtual stage whose output it is,
  // micro-batch) in order.
  std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>> sent(
      2, std::vector<std::vector<std::pair<int64_t, int64_t>>>(size_t(S))), received = sent;
  for (const auto& row : s.ticks)
    for (int64_t st = 0; st < S; ++st) {
      const auto& a = row[size_t(st)];
      if (!a) continue;
      const int64_t c = virtual_stage(st, a->local_stage, S);
      const int64_t p = int64_t(a->pass);
      if (a->pass == Pass::Forward) {
        if (c > 0) received[size_t(p)][size_t(st)].push_back({c - 1, a->micro_batch});
        if (c + 1 < C) sent[size_t(p)][size_t(st)].push_back({c, a->micro_batch});
      } else {
        if (c + 1 < C) received[size_t(p)][size_t(st)].push_back({c, a->micro_batch});
        if (c > 0) sent[size_t(p)][size_t(st)].push_back({c - 1, a->micro_batch});
      }
    }
  for (int64_t st = 0; st < S; ++st) {
    CHECK(sent[0][size_t(st)] == received[0][size_t((st + 1) % S)]);      // activations go to rank + 1
    CHECK(sent[1][size_t(st)] == received[1][size_t((st + S - 1) % S)]);  // gradients to rank - 1
  }
}

}  // namespace

TEST_CASE("GPipe: fill, then drain; the picture") {
  Schedule s = gpipe_schedule(3, 4);
  check_valid(s);
  CHECK(draw(s) ==
        "stage 0: F0 F1 F2 F3 .  .  .  .  B0 B1 B2 B3\n"
        "stage 1: .  F0 F1 F2 F3 .  .  B0 B1 B2 B3 .\n"
        "stage 2: .  .  F0 F1 F2 F3 B0 B1 B2 B3 .  .\n");
  for (int64_t st = 0; st < 3; ++st) CHECK(peak_activations(s, st) == 4);  // all M micro-batches
}

TEST_CASE("1F1B: warm-up, one forward one backward, cool-down; at most S - s activations on stage s") {
  Schedule s = one_f_one_b_schedule(3, 4);
  check_valid(s);
  CHECK(draw(s) ==
        "stage 0: F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3\n"
        "stage 1: .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .\n"
        "stage 2: .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .\n");
  for (int64_t stages : {1, 2, 4}) {
    for (int64_t m : {1, 3, 8, 16}) {
      CAPTURE(stages);
      CAPTURE(m);
      Schedule big = one_f_one_b_schedule(stages, m);
      check_valid(big);
      Schedule fill = gpipe_schedule(stages, m);
      check_valid(fill);
      for (int64_t st = 0; st < stages; ++st) {
        CHECK(peak_activations(big, st) <= std::min(stages - st, m));
        CHECK(peak_activations(fill, st) == m);
      }
    }
  }
}

TEST_CASE("more micro-batches shrink the bubble: (S - 1) / (M + S - 1) of the time for GPipe") {
  // Forward and backward ticks take the same time here; the bubble is the idle share.
  CHECK(bubble_fraction(gpipe_schedule(1, 4)) == 0.0);
  const double b4 = bubble_fraction(gpipe_schedule(4, 4)), b16 = bubble_fraction(gpipe_schedule(4, 16));
  CHECK(b16 < b4);
  CHECK(bubble_fraction(gpipe_schedule(2, 8)) == doctest::Approx(1.0 / (8 + 1)).epsilon(0.25));
}

TEST_CASE("orders that deadlock, and unknown names, are clear errors") {
  // Stage 1 wants micro-batch 1's forward first, stage 0 runs micro-batch 1 only after
  // micro-batch 0's backward, which needs stage 1: nobody can move.
  std::vector<std::vector<Action>> orders = {
      {{Pass::Forward, 0}, {Pass::Backward, 0}, {Pass::Forward, 1}, {Pass::Backward, 1}},
      {{Pass::Forward, 1}, {Pass::Forward, 0}, {Pass::Backward, 0}, {Pass::Backward, 1}}};
  CHECK_THROWS_WITH_AS(place_on_clock(orders, 2), doctest::Contains("deadlock"), Error);
  CHECK_THROWS_WITH_AS(place_on_clock({{{Pass::Forward, 0}}}, 1), doctest::Contains("lacks the forward or the backward"),
                       Error);
  CHECK_THROWS_WITH_AS(make_schedule("zero-bubble", 2, 2), doctest::Contains("expected gpipe, 1f1b or interleaved_1f1b"),
                       Error);
  CHECK_THROWS_WITH_AS(make_schedule("1f1b", 2, 2, 2), doctest::Contains("1f1b runs one virtual stage per stage (V = 1), got 2"), Error);
  CHECK_THROWS_WITH_AS(interleaved_1f1b_schedule(2, 2, 0), doctest::Contains("at least one virtual stage"), Error);
  CHECK_THROWS_WITH_AS(place_on_clock({{{Pass::Forward, 0, 1}, {Pass::Backward, 0, 1}}}, 1),
                       doctest::Contains("local stage 1 is out of range for 1 virtual stages per stage"), Error);
  CHECK_THROWS_WITH_AS(gpipe_schedule(0, 2), doctest::Contains("at least one stage"), Error);
}

TEST_CASE("interleaved 1F1B: V virtual stages per stage, every dependency, the picture, messages in order") {
  Schedule s = interleaved_1f1b_schedule(2, 4, 2);
  check_valid(s);
  // Stage 0 holds virtual stages 0 and 2 (a, b), stage 1 virtual stages 1 and 3: a
  // micro-batch goes 0a -> 1a -> 0b -> 1b and back.
  CHECK(draw(s) ==
        "stage 0: F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a .   B2b .   B3b B2a B3a\n"
        "stage 1: .   F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a .\n");
  CHECK(bubble_fraction(s) == doctest::Approx(1.0 / 9));  // (S - 1) / (V·M + S - 1)
  for (int64_t stages : {1, 2, 3, 4})
    for (int64_t v : {1, 2, 3})
      for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 16}) {
        CAPTURE(stages);
        CAPTURE(v);
        CAPTURE(m);
        Schedule big = interleaved_1f1b_schedule(stages, m, v);
        check_valid(big);
        check_backward_order(big);
        check_messages_in_order(big);
        check_messages_in_order(one_f_one_b_schedule(stages, m));
        check_messages_in_order(gpipe_schedule(stages, m));
        // Megatron's warm-up bounds the virtual-stage activations a stage holds: 2·(S - 1 - s) +
        // (V - 1)·S + 1, each 1/V of a stage's (V = 1: 1F1B's S - s, up to a factor of 2).
        const int64_t round = (m + std::max<int64_t>(1, m / stages) - 1) / std::max<int64_t>(1, m / stages);
        for (int64_t st = 0; st < stages; ++st)
          CHECK(peak_activations(big, st) <= std::min(2 * (stages - 1 - st) + (v - 1) * round + 1, v * m));
      }
  CHECK(interleaved_1f1b_order(3, 6, 1) != one_f_one_b_order(3, 6));  // V = 1 warms up longer: 2·(S-1-s)
}

TEST_CASE("the bubble: (S - 1) / (V·M + S - 1) of each stage's time, in ticks of one virtual stage") {
  // With forward and backward of a virtual stage taking one tick each, a stage is busy 2·V·M
  // ticks. GPipe and 1F1B idle 2·(S - 1) whole-stage ticks; interleaved idles 2·(S - 1)
  // ticks of 1/V of a stage (when S divides M).
  auto idle_share = [](const Schedule& s) { return bubble_fraction(s); };
  for (int64_t stages : {2, 4})
    for (int64_t m : {4, 8, 16}) {
      CAPTURE(stages);
      CAPTURE(m);
      const double expected = double(stages - 1) / double(m + stages - 1);
      CHECK(idle_share(gpipe_schedule(stages, m)) == doctest::Approx(expected));
      CHECK(idle_share(one_f_one_b_schedule(stages, m)) == doctest::Approx(expected));
      for (int64_t v : {2, 4}) {
        CAPTURE(v);
        const double interleaved = double(stages - 1) / double(v * m + stages - 1);
        // In ticks of 1/V of a stage's work the whole-stage schedules' bubble is the same
        // share; interleaved's is V times smaller (plus at most one tick per stage of
        // Megatron's ordering).
        CHECK(idle_share(interleaved_1f1b_schedule(stages, m, v)) <= interleaved * 1.0001 + 1.0 / (2 * v * m));
        CHECK(idle_share(interleaved_1f1b_schedule(stages, m, v)) < expected);
      }
    }
}
