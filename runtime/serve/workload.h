// Request arrivals with the semantics of vLLM's benchmark_serving: request_rate = inf sends everything at
// once; otherwise inter-arrival gaps are Gamma(shape = burstiness, scale = 1 / (rate · burstiness)), so
// burstiness 1 is a Poisson process and smaller values are burstier (the gaps' squared coefficient of
// variation is 1 / burstiness). Seeded and deterministic.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

struct ArrivalOptions {
  int64_t num_requests = 0;
  double request_rate = 0;   // requests per second; infinity = all at t = 0
  double burstiness = 1.0;
  uint64_t seed = 0;
};

// Arrival times in seconds, non-decreasing, the first at 0. InvalidArgument for a rate <= 0, burstiness <= 0
// or a negative count.
Result<std::vector<double>> ArrivalTimes(const ArrivalOptions& options);

}  // namespace eldr
