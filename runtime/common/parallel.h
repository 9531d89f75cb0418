// ParallelFor: split [0, n) over the machine's cores with plain std::threads. The body must not throw
// (STYLE.md: never throw across a thread boundary); keep the first error in the caller's own state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace eldr {

inline int DefaultThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

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
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += threads) body(i);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace eldr
