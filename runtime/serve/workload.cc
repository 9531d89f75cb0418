#include "runtime/serve/workload.h"

#include <cmath>
#include <random>

namespace eldr {

Result<std::vector<double>> ArrivalTimes(const ArrivalOptions& o) {
  if (o.num_requests < 0) return Status::InvalidArgument("the number of requests must be >= 0");
  if (!(o.request_rate > 0)) return Status::InvalidArgument("request_rate must be > 0 (use inf to send all at once)");
  if (!(o.burstiness > 0) || !std::isfinite(o.burstiness)) return Status::InvalidArgument("burstiness must be > 0");
  std::vector<double> t(o.num_requests, 0.0);
  if (std::isinf(o.request_rate)) return t;
  std::mt19937_64 rng(o.seed);
  std::gamma_distribution<double> gap(o.burstiness, 1.0 / (o.request_rate * o.burstiness));
  for (int64_t i = 1; i < o.num_requests; ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

}  // namespace eldr
