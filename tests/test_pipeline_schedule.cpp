// The pipeline schedules (parallel/pipeline/schedule.h) as data, without devices: their
// pictures, dependencies, activation memory and bubbles.
#include <doctest/doctest.h>

#include "core/error.h"
#include "parallel/pipeline/schedule.h"

using namespace loom;
using namespace loom::parallel::pipeline;

namespace {

// Every action's dependency finished at an earlier tick, and every stage runs every
// micro-batch's forward and backward exactly once.
void check_valid(const Schedule& s) {
  std::vector<std::vector<std::vector<int64_t>>> at(
      2, std::vector<std::vector<int64_t>>(size_t(s.stages), std::vector<int64_t>(size_t(s.micro_batches), -1)));
  for (size_t t = 0; t < s.ticks.size(); ++t)
    for (int64_t st = 0; st < s.stages; ++st)
      if (const auto& a = s.ticks[t][size_t(st)]) {
        REQUIRE(at[size_t(a->pass)][size_t(st)][size_t(a->micro_batch)] == -1);
        at[size_t(a->pass)][size_t(st)][size_t(a->micro_batch)] = int64_t(t);
      }
  for (int64_t st = 0; st < s.stages; ++st)
    for (int64_t m = 0; m < s.micro_batches; ++m) {
      const int64_t f = at[0][size_t(st)][size_t(m)], b = at[1][size_t(st)][size_t(m)];
      REQUIRE(f >= 0);
      REQUIRE(b > f);
      if (st > 0) CHECK(f > at[0][size_t(st) - 1][size_t(m)]);
      if (st + 1 < s.stages) CHECK(b > at[1][size_t(st) + 1][size_t(m)]);
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
  CHECK_THROWS_WITH_AS(make_schedule("zero-bubble", 2, 2), doctest::Contains("expected gpipe or 1f1b"), Error);
  CHECK_THROWS_WITH_AS(gpipe_schedule(0, 2), doctest::Contains("at least one stage"), Error);
}
