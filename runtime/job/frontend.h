// The frontend of a job (DESIGN.md §2 "rank 0: frontend + router"): what `eldr serve`'s rank 0 and `eldr
// simulate` both do between the workload and the workers, written once so both report the same routing.
//
//  - Admission: workload requests whose arrival is due are sent, in order and within max_concurrency, to the
//    prefill rank with the fewest outstanding requests (sent, first token not back; tie → lower index).
//  - Routing: when a request's first token and prefill counts come back, the job's Router decides its decoder.
//    While every decoder is at its admission cap (decision -1), or while earlier requests are held, the
//    request is held (FIFO); held requests are released, in order, when a finish frees a decoder's slot.
//  - Decode work: the router keeps each routed request's record; every output token is reported to it
//    (Router::ConsumeToken), which re-predicts the request's remaining decode tokens (eldr_tail's load, eldr's
//    overlap shares), and its finish releases the record (Router::Complete).
//  - Accounting: each request's record (arrival, token times, decoder, success, error); per decoder the
//    requests routed to it and its decode steps (DecoderRecord); the routing statistics of metrics.json.
//
// The caller owns time and transport: it tells the frontend what arrived and when (seconds from the start),
// and the frontend asks it to send through FrontendActions, synchronously, from inside the call that decides.
//
// Thread safety: not thread-safe; one owner (rank 0's loop or the simulation).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/calib/calibration.h"
#include "runtime/common/status.h"
#include "runtime/job/job_config.h"
#include "runtime/job/metrics.h"
#include "runtime/job/workload.h"
#include "runtime/router/router.h"

namespace eldr {

// What the frontend asks its owner to send. Both are required.
struct FrontendActions {
  // Send workload request `request` to prefill rank `prefill` (an index in [0, prefill_ranks)).
  std::function<void(int64_t request, int prefill)> send_to_prefill;
  // `request` is routed to decoder `decoder` (an index in [0, decode_ranks)): tell its prefill rank.
  std::function<void(int64_t request, int decoder)> send_route;
};

// What the frontend learns of one decoder (DecoderStats is its metrics.json form).
struct DecoderRecord {
  int64_t requests = 0;               // routed to it
  int64_t steps = 0;                  // decode steps with batch > 0
  double batch_sum = 0;               // Σ batch over those steps
  double distinct_sum = 0;            // Σ distinct experts over those steps
  DistinctByBatch by_batch;           // the same steps by batch size (matched-batch comparisons)
  std::vector<double> rank_load_sum;  // [ep_size] Σ over the steps reporting EP loads of each EP rank's load
  std::vector<double> balancedness;   // one per step reporting EP loads
};

class Frontend {
 public:
  // The job's router (JobRouterConfig; `calib` is required by signature policies, may be null otherwise) and
  // its arrival times (ArrivalTimes). Errors name the config or the calibration. REQUIRES: `config` and
  // `requests` outlive the frontend.
  // `simulated_cost`: the cost model `eldr simulate` runs with (eldr prices in it unless routing.cost_model
  // is set; JobStepCost); null in serve.
  static Result<Frontend> Create(const JobConfig& config, const JobRequests& requests, const TraceShape& model_shape,
                                 const Calibration* calib, FrontendActions actions,
                                 const CostModel* simulated_cost = nullptr);

  // Arrival times in seconds from the start, [num_requests()], non-decreasing.
  const std::vector<double>& arrivals() const { return arrivals_; }
  // How many requests have arrived by time t (arrival <= t).
  int64_t DueBy(double t) const;
  // At most this many requests are outstanding (sent, first token not back) per prefill rank; the rest wait at
  // the frontend, in order. A prefill rank polls for routing decisions by tag, and MPI searches its unexpected
  // messages one by one: 300 000 prompts queued at one slowed a serve job about a thousandfold.
  static constexpr int64_t kPrefillQueue = 64;
  // Sends requests [sent(), due) while max_concurrency and kPrefillQueue allow, each to the prefill rank with the
  // fewest outstanding. Each is stamped with the time it was due at the frontend, which its TTFT counts from: its
  // scheduled arrival or, when max_concurrency held it, the time the slot it takes was freed (a closed-loop client
  // sends it then), whichever is later; never later than `now`. A request held back (by either bound, or because
  // the caller sends in portions: serve's rank 0 bounds one pass) so leaves no wait out of the latencies. Call it
  // again whenever a bound may have freed: an arrival, a first token, a finish.
  void Admit(int64_t due, double now);

  // Prefill's result reached the frontend at t: the first token (recorded when given) and the counts [L, E]
  // the router needs. Routes the request or holds it.
  void OnFirstToken(int64_t request, double t, std::optional<int32_t> token, std::vector<float> counts);
  // Output token of `request` reached the frontend at t; tokens beyond output_len are ignored.
  void OnToken(int64_t request, double t, std::optional<int32_t> token);
  // A decode step of `decoder` (batch 0: nothing ran, not counted); `rank_load` [ep_size] or empty.
  void OnDecodeStep(int decoder, int64_t batch, int64_t distinct_experts, std::span<const int64_t> rank_load,
                    double balancedness);
  // `request` finished (ok) or failed with `error`, as the frontend learnt at time t: its max_concurrency slot
  // and its decoder's slot free (Router::Complete) and held requests are routed while a decoder admits them.
  // A failure before the first token also ends the request's outstanding prefill.
  void Finish(int64_t request, double t, bool ok, const std::string& error = "");
  // The job ends early (watchdog): every request not finished is marked failed, with `never_sent` or
  // `unfinished` as its error; one never sent is stamped with its scheduled arrival.
  void AbandonUnfinished(const std::string& never_sent, const std::string& unfinished);

  int64_t num_requests() const { return static_cast<int64_t>(records_.size()); }
  int64_t sent() const { return next_; }
  int64_t num_done() const { return done_; }
  bool done() const { return done_ == num_requests(); }
  int prefill_of(int64_t request) const { return prefill_of_[request]; }
  int64_t prefill_outstanding(int prefill) const { return prefill_outstanding_[prefill]; }
  int64_t decoder_in_flight(int decoder) const { return router_.decoders()[decoder].in_flight; }
  const Router& router() const { return router_; }

  const std::vector<RequestRecord>& records() const { return records_; }
  std::vector<RequestRecord> TakeRecords() { return std::move(records_); }
  const std::vector<DecoderRecord>& decoders() const { return decoders_; }
  // The per-decoder statistics of metrics.json (decoder index, leader rank, ep_size from the config).
  std::vector<DecoderStats> DecoderStatistics() const;
  // The routing statistics of metrics.json: τ in effect, band sizes of signature-routed requests, fallbacks.
  const RoutingStats& routing() const { return routing_; }

 private:
  Frontend(const JobConfig& config, const JobRequests& requests, Router router, std::vector<double> arrivals,
           FrontendActions actions);
  bool Route(int64_t request, const std::vector<float>& counts);
  void ReleaseHeld();

  const JobConfig* config_;
  const JobRequests* requests_;
  Router router_;
  std::vector<double> arrivals_;
  FrontendActions actions_;
  std::vector<RequestRecord> records_;
  std::vector<int> prefill_of_;               // [N] -1 until sent
  std::vector<int64_t> prefill_outstanding_;  // [prefill_ranks]
  std::vector<RoutingDecision> routed_;  // [N] each routed request's decision while in the router; decoder −1 after
  std::vector<DecoderRecord> decoders_;  // [decode_ranks]
  std::deque<std::pair<int64_t, std::vector<float>>> held_;  // every decoder at its cap: (request, counts)
  std::deque<double> free_slots_;  // max_concurrency > 0: since when each free slot is free, oldest first
  RoutingStats routing_;
  int64_t next_ = 0, active_ = 0, done_ = 0;
};

}  // namespace eldr
