#include "examples/train/progress.h"

#include <unistd.h>  // defines: isatty, to draw in place only on a terminal

#include <cstdio>

namespace loom::examples {

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

void ProgressBar::finish() {
  if (enabled_ && interactive_) std::fputc('\n', stderr);
}

}  // namespace loom::examples
