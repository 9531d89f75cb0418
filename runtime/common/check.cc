#include "runtime/common/check.h"

#include <algorithm>
#include <cstdlib>

namespace eldr {

int LauncherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return -1;
}

int LauncherWorldSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(name)) return std::max(1, std::atoi(v));
  }
  if (std::getenv("SLURM_STEP_ID") != nullptr) {
    if (const char* v = std::getenv("SLURM_NTASKS")) return std::max(1, std::atoi(v));
  }
  return 1;
}

namespace {
std::string Describe(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << file << ":" << line;
  int rank = LauncherRank();
  if (rank >= 0) os << " [rank " << rank << "]";
  os << ": " << what;
  return os.str();
}
}  // namespace

Error::Error(const char* file, int line, const std::string& what)
    : std::runtime_error(Describe(file, line, what)), file_(file), line_(line), rank_(LauncherRank()) {}

}  // namespace eldr
