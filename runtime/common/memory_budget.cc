#include "runtime/common/memory_budget.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace eldr {

namespace {

// The first integer of the file, or -1 ("max", missing, unreadable).
int64_t ReadInteger(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || s == "max") return -1;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  return *end == '\0' && v >= 0 ? v : -1;
}

int64_t MemAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

}  // namespace

uint64_t AvailableMemoryBytes() {
  if (const char* env = std::getenv("ELDR_MEMORY_BUDGET")) return std::strtoull(env, nullptr, 10);
  int64_t avail = MemAvailable();
  const int64_t limit = ReadInteger("/sys/fs/cgroup/memory.max");
  if (limit >= 0) {
    const int64_t used = ReadInteger("/sys/fs/cgroup/memory.current");
    const int64_t left = limit - (used > 0 ? used : 0);
    if (avail < 0 || left < avail) avail = left > 0 ? left : 0;
  }
  return avail < 0 ? 0 : static_cast<uint64_t>(avail);
}

std::string FormatBytes(double bytes) {
  char buf[64];
  if (bytes >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.1f GB", bytes / 1e9);
  } else if (bytes >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.1f MB", bytes / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  }
  return buf;
}

Status CheckMemoryBudget(double bytes, const std::string& what) {
  const uint64_t avail = AvailableMemoryBytes();
  if (avail == 0 && std::getenv("ELDR_MEMORY_BUDGET") == nullptr) return Status::Ok();  // unknown: no bound
  if (!(bytes <= static_cast<double>(avail))) {
    return Status::ResourceExhausted(what + ": needs " + FormatBytes(bytes) + ", this machine has " +
                                     FormatBytes(static_cast<double>(avail)) + " available");
  }
  return Status::Ok();
}

}  // namespace eldr
