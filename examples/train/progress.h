// Progress: the running metrics of an epoch and the one-line progress bar.
//
//   epoch 1/3 [=========>          ] 180/390  loss 1.2345  acc 55.21%  412.3 img/s
//
// Sums are kept as (loss * examples, correct, examples) so that averages over batches of
// different sizes, and over ranks (all-reduced sums), are exact.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace loom::examples {

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

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total_steps, bool enabled);
  // Redraws at most ~10 times a second, and always on the last step.
  void update(int64_t step, const RunningMetrics& metrics, double images_per_second);
  void finish();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool interactive_;
  std::chrono::steady_clock::time_point last_draw_{};
  int64_t last_printed_step_ = -1;
};

}  // namespace loom::examples
