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

Result<std::optional<uint64_t>> MemoryBudgetFromEnvironment() {
  const char* env = std::getenv("ELDR_MEMORY_BUDGET");
  if (env == nullptr) return std::optional<uint64_t>();
  const std::string text = env;
  const auto bad = [&] {
    return Status::InvalidArgument("ELDR_MEMORY_BUDGET='" + text +
                                   "' must be a whole number of bytes >= 1, optionally with K, M, G or T (e.g. 10G)");
  };
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 19 || text.size() > digits + 1) return bad();
  int shift = 0;
  if (text.size() == digits + 1) {
    const std::string units = "KMGT";
    const size_t u = units.find(text[digits]);
    if (u == std::string::npos) return bad();
    shift = 10 * static_cast<int>(u + 1);
  }
  const uint64_t v = std::strtoull(text.substr(0, digits).c_str(), nullptr, 10);
  if (v == 0 || (shift > 0 && v > (~uint64_t{0} >> shift))) return bad();
  return std::optional<uint64_t>(v << shift);
}

uint64_t AvailableMemoryBytes() {
  // Checked by the command line before any work; a library caller with a malformed value gets the machine's figure.
  if (auto budget = MemoryBudgetFromEnvironment(); budget.ok() && budget.value().has_value()) return *budget.value();
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
    const bool from_environment = std::getenv("ELDR_MEMORY_BUDGET") != nullptr;
    return Status::ResourceExhausted(what + ": needs " + FormatBytes(bytes) + ", this machine has " +
                                     FormatBytes(static_cast<double>(avail)) + " available" +
                                     (from_environment ? " (as ELDR_MEMORY_BUDGET says)" : ""));
  }
  return Status::Ok();
}

}  // namespace eldr
