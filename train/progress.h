// Progress: the running metrics of an epoch, the one-line progress bar and the run's expected
// duration.
//
//   epoch 1/3 [=========>          ] 180/390  loss 1.2345  acc 55.21%  412.3 img/s
//
// and, once, after the first few steps, how long the whole run will take.
//
// Sums are kept as (loss * examples, correct, examples) so that averages over batches of
// different sizes, and over ranks (all-reduced sums), are exact.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace loom::training {

struct RunningMetrics {
  double loss_sum = 0;  // sum over examples of the per-example loss
  double correct = 0;
  double examples = 0;

  void add(double mean_loss, int64_t batch_correct, int64_t batch_size) {
    loss_sum += mean_loss * static_cast<double>(batch_size);
    correct += static_cast<double>(batch_correct);
    examples += static_cast<double>(batch_size);
  }
  double loss() const { return examples > 0 ? loss_sum / examples : 0; }
  double accuracy() const { return examples > 0 ? correct / examples : 0; }
  // "<what> loss 1.2345  <what> acc 56.78%", or "no <what> images" (--eval-limit 0, or
  // --max-steps 0): a loss of 0 would read as a result.
  std::string str(const char* what) const {
    char text[96];
    if (examples > 0)
      std::snprintf(text, sizeof(text), "%s loss %.4f  %s acc %.2f%%", what, loss(), what, 100 * accuracy());
    else
      std::snprintf(text, sizeof(text), "no %s images", what);
    return text;
  }
};

// What a run will do, for the time it is expected to take.
struct RunPlan {
  int64_t epochs = 1;
  int64_t steps_per_epoch = 0;
  int64_t max_steps = -1;  // --max-steps: stop after this many steps in all; -1: no limit
  int64_t batch_size = 1;
  int64_t test_images = 0;  // this process's share of each test pass (one after every epoch)
};

// How long the whole run takes at the measured speed, and how to shorten it:
//   expected: 3 epochs x 390 steps at 0.41 s/step ≈ 8 min, 3 test passes ≈ 33 s
//   (shorten with --epochs N or --max-steps N; --eval-limit N tests fewer images)
// A test image costs about a third of a training image (forward only: no backward, no
// optimizer step; 0.37 measured with ResNet18 on a 2-core machine).
std::string expected_duration_line(const RunPlan& plan, double seconds_per_step);

// "0.2 s", "45 s", "8 min", "2 h 05 min".
std::string format_duration(double seconds);

class ProgressBar {
 public:
  // Training steps timed before the expected duration is said (the first, untimed, step
  // warms caches and the allocator).
  static constexpr size_t kStepsBeforeEstimate = 5;

  ProgressBar(std::string label, int64_t total_steps, bool enabled);
  // Redraws at most ~10 times a second, and always on the last step.
  void update(int64_t step, const RunningMetrics& metrics, double images_per_second);
  // Says expected_duration_line once in a run: when `step_seconds` (every timed step's
  // seconds so far) has just reached kStepsBeforeEstimate, at their median.
  void say_expected_duration(const RunPlan& plan, const std::vector<double>& step_seconds);
  void finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool interactive_;
  std::chrono::steady_clock::time_point last_draw_{};
  int64_t last_printed_step_ = -1;
};

}  // namespace loom::training
