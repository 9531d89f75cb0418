#include "runtime/common/progress.h"

#include <unistd.h>

#include <cstdio>

namespace eldr {

ProgressBar::ProgressBar(std::string label, int64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled && ::isatty(STDERR_FILENO)) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

ProgressBar::~ProgressBar() {
  if (enabled_ && drawn_) std::fprintf(stderr, "\n");
}

void ProgressBar::Update(int64_t done) {
  done_ = done;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  // Work that ends within a blink draws nothing; after that, at most ten redraws a second.
  if (!drawn_ && now - start_ < std::chrono::milliseconds(300)) return;
  if (drawn_ && done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  const int width = 30;
  double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  if (frac > 1) frac = 1;
  int filled = static_cast<int>(frac * width);
  double secs = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%-24s [%.*s%*s] %5.1f%% %lld/%lld %.1fs", label_.c_str(), filled,
               "##############################", width - filled, "", 100.0 * frac, static_cast<long long>(done_),
               static_cast<long long>(total_), secs);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (enabled_ && drawn_) {
    Update(total_);
    std::fprintf(stderr, "\n");
    drawn_ = false;
    enabled_ = false;
  }
}

}  // namespace eldr
