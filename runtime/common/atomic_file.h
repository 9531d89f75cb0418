// AtomicOutput: write an output file under a temporary name in the same directory and rename it into
// place on Commit(), so that a failed run never leaves a partial file (DESIGN.md §5).
#pragma once

#include <string>

#include "runtime/common/status.h"

namespace eldr {

class AtomicOutput {
 public:
  // Chooses "<dir>/.<name>.tmp.<pid>" next to `path`. Nothing is created yet.
  explicit AtomicOutput(std::string path);
  ~AtomicOutput();  // removes the temporary unless committed
  AtomicOutput(const AtomicOutput&) = delete;
  AtomicOutput& operator=(const AtomicOutput&) = delete;

  // Fails, naming the path and the reason, when the directory does not exist or is not writable.
  Status CheckWritable() const;
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  // Renames the temporary onto path(). REQUIRES: the temporary was written and closed.
  Status Commit();

 private:
  std::string path_;
  std::string temp_path_;
  bool committed_ = false;
};

// Writes `content` to `path` atomically.
Status WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace eldr
