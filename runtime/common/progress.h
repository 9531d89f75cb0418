// A progress bar on stderr, drawn only when stderr is a terminal (so logs and CI stay clean).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace eldr {

class ProgressBar {
 public:
  // `total` units of work labelled `label`. Pass enabled=false to force it off.
  ProgressBar(std::string label, int64_t total, bool enabled = true);
  ~ProgressBar();  // finishes the line if anything was drawn
  void Update(int64_t done);
  void Advance(int64_t n = 1) { Update(done_ + n); }
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
