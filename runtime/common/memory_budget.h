// Bounds before allocation: a count read from the command line or a file that sizes memory (requests x repeats,
// layers x experts x tokens) is checked against what the machine can give before anything is allocated, so
// that an absurd count is one line ("--repeat 100000000: needs 690.0 GB, this machine has 20.1 GB available")
// instead of an OOM kill.
//
// Thread safety: reentrant (reads /proc and /sys on each call).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/common/status.h"

namespace eldr {

// Bytes this process may still allocate: the lower of /proc/meminfo's MemAvailable and the cgroup v2 limit
// (/sys/fs/cgroup/memory.max minus memory.current) when there is one; 0 when neither can be read.
// ELDR_MEMORY_BUDGET replaces it (tests; see MemoryBudgetFromEnvironment).
uint64_t AvailableMemoryBytes();

// ELDR_MEMORY_BUDGET parsed: a whole number of bytes >= 1, optionally followed by K, M, G or T (powers of 1024),
// e.g. "1048576" or "10G"; nullopt when unset. InvalidArgument naming the variable and its value otherwise (the
// command line checks it before any work, so a typo is never read as 0 bytes or as no budget at all).
Result<std::optional<uint64_t>> MemoryBudgetFromEnvironment();

// ResourceExhausted "WHAT: needs N GB, this machine has M GB available" (with " (as ELDR_MEMORY_BUDGET says)" when
// that variable set the budget) when `bytes` exceed
// AvailableMemoryBytes() (doubles, so that a product of counts cannot overflow). OK when the budget is unknown.
Status CheckMemoryBudget(double bytes, const std::string& what);

// "1.5 GB", "20.0 MB", "512 B".
std::string FormatBytes(double bytes);

}  // namespace eldr
