// train/progress.h: the expected-duration line a new user sees after the first few
// steps of train_cifar10 (how long the run takes, and how to shorten it), as a pure function.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "train/progress.h"

using namespace loom::training;

namespace {
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("format_duration: seconds, then minutes, then hours and minutes") {
  CHECK(format_duration(0.23) == "0.2 s");
  CHECK(format_duration(9.94) == "9.9 s");
  CHECK(format_duration(45.4) == "45 s");
  CHECK(format_duration(89) == "89 s");
  CHECK(format_duration(480) == "8 min");
  CHECK(format_duration(89 * 60) == "89 min");
  CHECK(format_duration(125 * 60 + 10) == "2 h 05 min");
}

TEST_CASE("expected_duration_line: the whole run at the measured speed, and how to shorten it") {
  // The default run: 3 epochs of 390 steps (50000 images, batch 128), a test pass of 10000 after each.
  RunPlan plan{.epochs = 3, .steps_per_epoch = 390, .max_steps = -1, .batch_size = 128, .test_images = 10000};
  const std::string line = expected_duration_line(plan, 0.41);
  CAPTURE(line);
  // 1170 steps x 0.41 s = 480 s; 3 passes x 10000 images at a third of 0.41 s / 128 images = 32 s.
  CHECK(line == "expected: 3 epochs x 390 steps at 0.41 s/step ≈ 8 min, 3 test passes ≈ 32 s "
                "(shorten with --epochs N or --max-steps N; --eval-limit N tests fewer images)");

  SUBCASE("--max-steps shorter than the epochs: that many steps, and the test passes of the epochs they reach") {
    plan.max_steps = 400;  // one step into epoch 2
    const std::string capped = expected_duration_line(plan, 1.5);
    CAPTURE(capped);
    CHECK(contains(capped, "expected: 400 steps (--max-steps) at 1.5 s/step ≈ 10 min, 2 test passes ≈ 78 s"));
    plan.max_steps = 20;
    CHECK(contains(expected_duration_line(plan, 1.5), "20 steps (--max-steps) at 1.5 s/step ≈ 30 s, 1 test pass ≈ 39 s"));
  }
  SUBCASE("--max-steps beyond the epochs changes nothing") {
    plan.max_steps = 5000;
    CHECK(expected_duration_line(plan, 0.41) == line);
  }
  SUBCASE("--eval-limit 0: no test passes, and no advice about them") {
    plan.test_images = 0;
    CHECK(expected_duration_line(plan, 0.41) ==
          "expected: 3 epochs x 390 steps at 0.41 s/step ≈ 8 min (shorten with --epochs N or --max-steps N)");
  }
  SUBCASE("one epoch of a long run: hours") {
    plan.epochs = 1;
    CHECK(contains(expected_duration_line(plan, 20), "expected: 1 epoch x 390 steps at 20 s/step ≈ 2 h 10 min"));
  }
}
