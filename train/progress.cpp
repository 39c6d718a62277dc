#include "train/progress.h"

#include <unistd.h>  // defines: isatty, to draw in place only on a terminal

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace loom::training {

namespace {
// A test image's cost relative to a training image's (see expected_duration_line).
constexpr double kTestImageCost = 1.0 / 3;
}  // namespace

std::string format_duration(double seconds) {
  char text[48];
  if (seconds < 10)
    std::snprintf(text, sizeof(text), "%.1f s", seconds);
  else if (seconds < 90)
    std::snprintf(text, sizeof(text), "%.0f s", seconds);
  else if (seconds < 90 * 60)
    std::snprintf(text, sizeof(text), "%.0f min", seconds / 60);
  else {
    const long long minutes = std::llround(seconds / 60);
    std::snprintf(text, sizeof(text), "%lld h %02lld min", minutes / 60, minutes % 60);
  }
  return text;
}

std::string expected_duration_line(const RunPlan& plan, double seconds_per_step) {
  const int64_t all = plan.epochs * plan.steps_per_epoch;
  const bool capped = plan.max_steps >= 0 && plan.max_steps < all;
  const int64_t steps = capped ? plan.max_steps : all;
  char text[160];
  if (capped)
    std::snprintf(text, sizeof(text), "expected: %lld steps (--max-steps)", static_cast<long long>(steps));
  else
    std::snprintf(text, sizeof(text), "expected: %lld epoch%s x %lld steps", static_cast<long long>(plan.epochs),
                  plan.epochs == 1 ? "" : "s", static_cast<long long>(plan.steps_per_epoch));
  std::string line = text;
  std::snprintf(text, sizeof(text), " at %.3g s/step ≈ ", seconds_per_step);
  line += text + format_duration(static_cast<double>(steps) * seconds_per_step);
  if (plan.test_images > 0 && plan.steps_per_epoch > 0) {
    // One pass after every epoch that ran, the last one cut short included.
    const int64_t passes = std::max<int64_t>((steps + plan.steps_per_epoch - 1) / plan.steps_per_epoch, 1);
    const double test_seconds = static_cast<double>(passes * plan.test_images) * seconds_per_step /
                                static_cast<double>(std::max<int64_t>(plan.batch_size, 1)) * kTestImageCost;
    std::snprintf(text, sizeof(text), ", %lld test pass%s ≈ ", static_cast<long long>(passes),
                  passes == 1 ? "" : "es");
    line += text + format_duration(test_seconds);
  }
  line += " (shorten with --epochs N or --max-steps N";
  if (plan.test_images > 0) line += "; --eval-limit N tests fewer images";
  return line + ")";
}

ProgressBar::ProgressBar(std::string label, int64_t total_steps, bool enabled)
    : label_(std::move(label)), total_(total_steps), enabled_(enabled), interactive_(isatty(fileno(stderr)) != 0) {}

void ProgressBar::update(int64_t step, const RunningMetrics& metrics, double images_per_second) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  bool last = step >= total_;
  // On a terminal: redraw in place ~10x a second. In a log file: a line every 10%.
  if (interactive_) {
    if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else {
    int64_t every = total_ >= 10 ? total_ / 10 : 1;
    if (!last && step % every != 0) return;
    if (step == last_printed_step_) return;
  }
  last_draw_ = now;
  last_printed_step_ = step;
  constexpr int kWidth = 24;
  int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : kWidth;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
  std::fprintf(stderr, "%s%s [%s] %lld/%lld  loss %.4f  acc %6.2f%%  %7.1f img/s%s", interactive_ ? "\r" : "",
               label_.c_str(), bar.c_str(), static_cast<long long>(step), static_cast<long long>(total_), metrics.loss(),
               100 * metrics.accuracy(), images_per_second, interactive_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::say_expected_duration(const RunPlan& plan, const std::vector<double>& step_seconds) {
  if (!enabled_ || step_seconds.size() != kStepsBeforeEstimate) return;
  std::vector<double> sorted = step_seconds;  // the median: one slow step (a page fault, a log write) moves it little
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  const std::string line = expected_duration_line(plan, sorted[sorted.size() / 2]);
  // On a terminal the bar is drawn in place: the line goes below it, and the bar follows.
  std::fprintf(stderr, "%s%s\n", interactive_ && last_printed_step_ >= 0 ? "\n" : "", line.c_str());
  std::fflush(stderr);
  last_draw_ = {};
}

void ProgressBar::finish() {
  if (enabled_ && interactive_) std::fputc('\n', stderr);
}

}  // namespace loom::training
