// `eldr route`: replays a routing trace through the Router with a simple load model, to show what each
// policy will do before a run. Arrivals are Poisson at `rate` requests/s in a seeded random order; a
// routed request stays in flight for its decode length × `step_ms`; every step, each decoder's batch is
// its in-flight requests, each contributing its current decode token. Distinct experts per step is
// Σ over MoE layers of |∪ over the batch's tokens of top-k(ℓ)| (DESIGN.md §3), from the trace's decode
// routing. The figure grows with the batch, and policies run different batches (a policy that piles requests
// onto a few decoders runs larger ones, which this load model does not slow down), so policies are compared at
// matched batch: distinct experts per step per batch size, and their steps-weighted ratio to jsq's
// (MatchedBatchRatio, common/distinct_experts.h). Distinct experts per token (Σ distinct / Σ batch) is not
// reported: it falls as the batch grows, which overstated the locality of policies with larger batches.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/calib/calibration.h"
#include "runtime/common/distinct_experts.h"
#include "runtime/router/router.h"
#include "runtime/trace/trace.h"

namespace eldr {

struct RouteReplayOptions {
  std::vector<RoutingPolicy> policies;  // empty = all
  std::optional<double> tau;            // unset: the calibration's τ
  double rate = 20;                     // requests per second; 0 or inf = all arrive at once
  double step_ms = 20;                  // decode step time
  int64_t admission_cap = 0;            // per decoder; 0 = none
  int repeat = 1;                       // replay the trace this many times
  uint64_t seed = 0;
  std::optional<CostModel> step_cost;  // eldr's cost model (unset: DistinctExpertsCost)
  int64_t max_batch = 64;              // eldr's decoder batch limit
};

// The cost model eldr prices in when the replay is given none: a decode step costs its distinct experts (b = 1,
// nothing else), the quantity the replay measures.
CostModel DistinctExpertsCost();

struct DecoderReplayStats {
  int64_t requests = 0;
  std::string top_domain;
  double purity = 0;  // share of the decoder's requests in its most common domain
  int64_t steps = 0;  // steps with a non-empty batch
  double mean_batch = 0;
  double mean_distinct_experts = 0;  // per step, summed over layers
};

struct PolicyReplayStats {
  std::string policy;
  double tau = 0;
  int64_t requests = 0;
  double mean_distinct_experts_per_step = 0;  // over all decoder-steps with a non-empty batch
  double mean_batch = 0;
  std::vector<BatchDistinctRow> distinct_by_batch;  // every decoder's steps by batch size (ascending)
  double mean_purity = 0;                           // request-weighted
  double mean_band_size = 0;                        // signature policies
  int64_t fallbacks = 0;
  int64_t held_at_router = 0;  // steps a request waited because every decoder was at its cap
  int64_t max_in_flight = 0;
  std::vector<DecoderReplayStats> decoders;
};

struct RouteReplayReport {
  int num_decoders = 0;
  int num_requests = 0;  // routed (each usable request × --repeat)
  int num_skipped = 0;   // the trace's requests that are not usable (usable_request.h), left out
  std::vector<PolicyReplayStats> policies;
  // MatchedBatchRatio of `p`'s distinct_by_batch against jsq's, and the share of p's steps at batch sizes jsq ran
  // (covered); nullopt when jsq was not replayed.
  std::optional<double> MatchedVsJsq(const PolicyReplayStats& p, double* covered) const;
  nlohmann::json ToJson() const;
  std::string ToText() const;
};

// FailedPrecondition when the trace's model shape differs from the calibration's (names both files), or when the
// calibration was fitted on decode tokens (Calibration::features: the replay routes on prompt counts).
Result<RouteReplayReport> ReplayRoutes(const Trace& trace, const Calibration& calib, const RouteReplayOptions& options,
                                       const std::string& trace_name, const std::string& calib_name);

}  // namespace eldr
