// ParallelFor: split [0, n) over the machine's cores with plain std::threads. An exception thrown by the
// body (bad_alloc, a failed ELDR_CHECK) never crosses the thread boundary: each worker stops at its first
// one, and the first is rethrown on the calling thread after all workers joined (STYLE.md "Errors").
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

// ELDR_NUM_THREADS parsed: a whole number in [1, kMaxThreads]; 0 when unset. InvalidArgument naming the variable
// and its value otherwise (the command line checks it before any work, so "abc" or "0" is never silently the
// hardware count).
constexpr int kMaxThreads = 4096;
inline Result<int> ThreadsFromEnvironment() {
  const char* env = std::getenv("ELDR_NUM_THREADS");
  if (env == nullptr) return 0;
  const std::string text = env;
  const bool digits = !text.empty() && text.size() <= 4 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int n = digits ? std::stoi(text) : 0;
  if (n < 1 || n > kMaxThreads) {
    return Status::InvalidArgument("ELDR_NUM_THREADS='" + text + "' must be a whole number in [1, " +
                                   std::to_string(kMaxThreads) + "] (threads per process)");
  }
  return n;
}

// Threads per process: ELDR_NUM_THREADS when set (a launcher running several ranks per node sets it to
// cores / ranks), else the hardware concurrency.
inline int DefaultThreads() {
  if (Result<int> n = ThreadsFromEnvironment(); n.ok() && *n >= 1) return *n;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Threads worth starting for `work` units (about one multiply-add each): starting a thread costs tens of
// microseconds, so small kernels (a decode step of a small model) run inline.
inline int ThreadsFor(int64_t work) { return work < (int64_t{1} << 18) ? 1 : DefaultThreads(); }

// Calls body(i) for every i in [0, n), interleaved over `num_threads` threads (i % threads), so that
// loops whose cost falls with i stay balanced.
template <typename Body>
void ParallelFor(int64_t n, Body body, int num_threads = DefaultThreads()) {
  const int threads = static_cast<int>(std::min<int64_t>(std::max(1, num_threads), std::max<int64_t>(n, 1)));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(threads);
  std::exception_ptr first_error;
  std::mutex mu;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        for (int64_t i = t; i < n; i += threads) body(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace eldr
