// ELDR_CHECK: for bugs and unrecoverable failures. Throws eldr::Error carrying file, line and rank.
// Expected failures are Status values (runtime/common/status.h), never exceptions.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace eldr {

// The MPI rank of this process as the launcher announced it (Open MPI, PMI, Slurm), or -1.
// Read from the environment so that common/ does not depend on MPI being initialised.
int LauncherRank();
// The number of processes the launcher started (Open MPI's mpirun, PMI, an srun step), or 1: not under a launcher,
// or in a Slurm batch script itself (SLURM_NTASKS without a job step).
int LauncherWorldSize();

class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& what);
  const char* file() const { return file_; }
  int line() const { return line_; }
  int rank() const { return rank_; }

 private:
  const char* file_;
  int line_;
  int rank_;
};

}  // namespace eldr

#define ELDR_CHECK(cond, msg)                                        \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::ostringstream eldr_check_os_;                             \
      eldr_check_os_ << "check failed: " #cond ": " << msg;          \
      throw ::eldr::Error(__FILE__, __LINE__, eldr_check_os_.str()); \
    }                                                                \
  } while (0)
