// A progress bar on stderr, drawn only when stderr is a terminal (so logs and CI stay clean) and the work has run
// for 300 ms (so a quick command prints no bar).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace eldr {

class ProgressBar {
 public:
  // `total` units of work labelled `label`. Pass enabled=false to force it off.
  ProgressBar(std::string label, int64_t total, bool enabled = true);
  // Ends the line where the bar stands if anything was drawn: an interrupted or failed run does not show 100 %.
  ~ProgressBar();
  void Update(int64_t done);
  void Advance(int64_t n = 1) { Update(done_ + n); }
  // The work is done: draws the bar full and ends the line. Call it on success only.
  void Finish();

 private:
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace eldr
