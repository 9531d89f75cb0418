#include "runtime/eval/route_replay.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "runtime/common/distinct_experts.h"
#include "runtime/common/json_util.h"
#include "runtime/common/memory_budget.h"
#include "runtime/common/usable_request.h"
#include "runtime/signature/signature.h"

namespace eldr {

namespace {

struct Active {
  int request;       // index into trace.requests
  int64_t progress;  // decode tokens already produced
  RoutingDecision decision;
};

}  // namespace

CostModel DistinctExpertsCost() {
  CostModel m;
  m.name = "distinct experts";
  m.source = "eldr route without --cost-model: a step costs its distinct experts";
  m.decode_b = 1;
  return m;
}

Result<RouteReplayReport> ReplayRoutes(const Trace& trace, const Calibration& calib, const RouteReplayOptions& o,
                                       const std::string& trace_name, const std::string& calib_name) {
  if (!trace.shape.SameAs(calib.shape)) {
    return Status::FailedPrecondition(trace_name + ": model shape " + trace.shape.ToString() + " differs from " +
                                      calib_name + " (" + calib.shape.ToString() + ")");
  }
  if (calib.features == SignatureFeatures::kDecode) {
    return Status::FailedPrecondition(calib_name +
                                      ": fitted on decode tokens (eldr calibrate --features decode); eldr route "
                                      "routes on prompt counts, use 'eldr simulate --route-on decode' for the ceiling");
  }
  if (!(o.rate >= 0)) return Status::InvalidArgument("--rate must be >= 0 or inf (0 and inf: all at once)");
  if (!(o.step_ms > 0) || !std::isfinite(o.step_ms)) return Status::InvalidArgument("--step-ms must be > 0");
  if (o.repeat < 1) return Status::InvalidArgument("--repeat must be >= 1");
  if (trace.requests.empty()) return Status::InvalidArgument(trace_name + ": the trace has no requests");
  if (calib.signature.variant == SignatureVariant::kGateProb && !trace.has_weights()) {
    return Status::FailedPrecondition(trace_name +
                                      ": the calibration uses gate_prob signatures but the trace has no weights");
  }
  // order and arrival (int + double) and the per-policy assignment and event state (~48 B) per replayed request.
  ELDR_RETURN_IF_ERROR(CheckMemoryBudget(
      static_cast<double>(o.repeat) * static_cast<double>(trace.requests.size()) * 64,
      "--repeat " + std::to_string(o.repeat) + " x " + std::to_string(trace.requests.size()) + " requests"));
  const int L = trace.shape.num_layers, E = trace.shape.num_experts, k = trace.shape.top_k;
  const int K = calib.num_clusters;
  // The usable requests (usable_request.h), as calibrate and place evaluate take them; the others are counted.
  std::vector<int32_t> all;
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    const TraceRequest& r = trace.requests[i];
    if (IsUsableRequest(r.prompt_len, r.decode_len())) all.push_back(static_cast<int32_t>(i));
  }
  if (all.empty()) {
    return Status::InvalidArgument(trace_name + ": none of its " + std::to_string(trace.requests.size()) +
                                   " requests has both prompt and decode tokens: nothing to route");
  }
  const RequestFeatures f = ComputeRequestFeatures(trace, all);
  const size_t row = f.row_size();

  // One arrival sequence shared by every policy: a seeded permutation per repeat, Poisson gaps. `order` holds
  // positions in `all` (the rows of `f`); all[position] is the request's index in the trace.
  std::mt19937_64 rng(o.seed);
  std::vector<int> order;
  for (int r = 0; r < o.repeat; ++r) {
    std::vector<int> perm(all.size());
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng() % i]);
    order.insert(order.end(), perm.begin(), perm.end());
  }
  std::vector<double> arrival(order.size(), 0.0);
  double t = 0;
  const bool spaced = o.rate > 0 && std::isfinite(o.rate);  // 0 and inf: all at once
  std::exponential_distribution<double> gap(spaced ? o.rate : 1.0);
  for (size_t i = 0; i < order.size(); ++i) {
    if (spaced && i > 0) t += gap(rng);
    arrival[i] = t;
  }
  const double step_s = o.step_ms / 1000.0;
  // Time advances in whole steps (an int64 step index, times step_s in double); past 2^53 steps a double no longer
  // tells one step from the next, and the replay would never reach the last arrival.
  constexpr double kMaxSteps = 9007199254740992.0;  // 2^53
  if (!arrival.empty() && !(arrival.back() / step_s <= kMaxSteps)) {
    std::ostringstream os;
    os << "the arrivals span " << arrival.back() << " s, more than " << kMaxSteps << " decode steps of " << o.step_ms
       << " ms: raise --rate (requests/s) or --step-ms";
    return Status::InvalidArgument(os.str());
  }

  RouteReplayReport report;
  report.num_decoders = K;
  report.num_requests = static_cast<int>(order.size());
  report.num_skipped = static_cast<int>(trace.requests.size() - all.size());
  std::vector<RoutingPolicy> policies = o.policies.empty() ? AllRoutingPolicies() : o.policies;
  ExpertUnion experts(L, E);  // one decode step's experts
  for (RoutingPolicy p : policies) {
    RouterConfig rc;
    rc.policy = p;
    rc.num_decoders = K;
    rc.tau = o.tau;  // unset: the calibration's
    rc.admission_cap = o.admission_cap;
    rc.seed = o.seed;
    rc.job_shape = trace.shape;
    if (p == RoutingPolicy::kEldr) {
      rc.step_cost = o.step_cost ? *o.step_cost : DistinctExpertsCost();
      rc.max_batch = o.max_batch;
    }
    std::vector<std::string> labels;
    for (const auto& r : trace.requests) labels.push_back(r.domain);
    rc.domains = labels;
    auto router_or = Router::Create(rc, &calib);
    if (!router_or.ok()) {
      if (p == RoutingPolicy::kDomain && o.policies.empty()) continue;  // unlabelled trace: skip the oracle
      return router_or.status().WithPrefix(calib_name);
    }
    Router router = std::move(router_or).value();
    PolicyReplayStats ps;
    ps.policy = RoutingPolicyName(p);
    ps.tau = router.tau();
    ps.decoders.assign(K, DecoderReplayStats());
    std::vector<std::vector<Active>> active(K);
    std::vector<std::map<std::string, int64_t>> domain_counts(K);
    std::vector<double> distinct_sum(K, 0), batch_sum(K, 0);
    int64_t band_sum = 0, band_n = 0;
    size_t next = 0;
    int64_t in_flight = 0;
    double total_distinct = 0;
    int64_t total_steps = 0;
    DistinctByBatch by_batch;
    double total_batch = 0;
    std::deque<int> waiting;  // arrived, but every decoder was at its cap
    for (int64_t step = 0; next < order.size() || in_flight > 0 || !waiting.empty(); ++step) {
      if (in_flight == 0 && waiting.empty() && next < order.size()) {
        // Idle: jump to the step of the next arrival instead of stepping through empty time.
        step = std::max(step, static_cast<int64_t>(std::ceil(arrival[next] / step_s - 1e-9)));
      }
      const double now = step * step_s;
      while (next < order.size() && arrival[next] <= now + 1e-12) waiting.push_back(order[next++]);
      // Route waiting requests in arrival order until none can be admitted.
      while (!waiting.empty()) {
        const size_t position = static_cast<size_t>(waiting.front());
        const int r = all[position];
        const TraceRequest& req = trace.requests[r];
        const RoutingDecision d =
            router.Route(f.prefill_counts.data() + position * row,
                         f.gate_sums.empty() ? nullptr : f.gate_sums.data() + position * row, req.domain);
        if (d.decoder < 0) {
          ++ps.held_at_router;
          break;
        }
        waiting.pop_front();
        if (UsesSignature(p)) {
          band_sum += d.band_size;
          ++band_n;
        }
        ps.fallbacks += d.fallback ? 1 : 0;
        ++ps.decoders[d.decoder].requests;
        ++domain_counts[d.decoder][req.domain];
        if (req.decode_len() == 0) continue;  // nothing to decode: in and out at once
        router.Dispatch(d);
        ++in_flight;
        active[d.decoder].push_back({r, 0, d});
      }
      ps.max_in_flight = std::max(ps.max_in_flight, in_flight);
      // One decode step on every decoder.
      for (int dec = 0; dec < K; ++dec) {
        auto& batch = active[dec];
        if (batch.empty()) continue;
        experts.Clear();
        for (const Active& a : batch) {
          const TraceRequest& req = trace.requests[a.request];
          experts.AddToken(trace.token_ids(req.offset + req.prompt_len + a.progress), k);
        }
        const int64_t distinct = experts.Total();
        by_batch.Add(static_cast<int64_t>(batch.size()), distinct);
        distinct_sum[dec] += static_cast<double>(distinct);
        batch_sum[dec] += static_cast<double>(batch.size());
        ++ps.decoders[dec].steps;
        total_distinct += static_cast<double>(distinct);
        total_batch += static_cast<double>(batch.size());
        ++total_steps;
        for (auto& a : batch) {
          ++a.progress;
          router.ConsumeToken(a.decision);
        }
        auto done = std::remove_if(batch.begin(), batch.end(), [&](const Active& a) {
          if (a.progress < trace.requests[a.request].decode_len()) return false;
          router.Complete(a.decision);
          --in_flight;
          return true;
        });
        batch.erase(done, batch.end());
      }
    }
    double purity_weighted = 0;
    for (int dec = 0; dec < K; ++dec) {
      auto& ds = ps.decoders[dec];
      ds.mean_distinct_experts = ds.steps ? distinct_sum[dec] / ds.steps : 0;
      ds.mean_batch = ds.steps ? batch_sum[dec] / ds.steps : 0;
      int64_t best = 0;
      for (const auto& [dom, n] : domain_counts[dec]) {
        if (n > best) {
          best = n;
          ds.top_domain = dom;
        }
      }
      ds.purity = ds.requests ? static_cast<double>(best) / ds.requests : 0;
      purity_weighted += static_cast<double>(best);
      ps.requests += ds.requests;
    }
    ps.mean_purity = ps.requests ? purity_weighted / ps.requests : 0;
    ps.mean_distinct_experts_per_step = total_steps ? total_distinct / total_steps : 0;
    ps.mean_batch = total_steps ? total_batch / total_steps : 0;
    ps.distinct_by_batch = by_batch.Rows();
    ps.mean_band_size = band_n ? static_cast<double>(band_sum) / band_n : 0;
    report.policies.push_back(std::move(ps));
  }
  return report;
}

std::optional<double> RouteReplayReport::MatchedVsJsq(const PolicyReplayStats& p, double* covered) const {
  for (const auto& q : policies) {
    if (q.policy == "jsq") return MatchedBatchRatio(p.distinct_by_batch, q.distinct_by_batch, covered);
  }
  return std::nullopt;
}

namespace {

// Mean distinct experts per step by batch size, one column per policy, for the batch sizes that hold at least 1 %
// of some policy's steps (all of them are in --json).
std::string ByBatchTable(const std::vector<PolicyReplayStats>& policies) {
  std::set<int64_t> batches;
  for (const auto& p : policies) {
    int64_t steps = 0;
    for (const BatchDistinctRow& r : p.distinct_by_batch) steps += r.steps;
    for (const BatchDistinctRow& r : p.distinct_by_batch) {
      if (100 * r.steps >= steps) batches.insert(r.batch);
    }
  }
  std::vector<std::string> header = {"batch"};
  for (const auto& p : policies) header.push_back(p.policy);
  std::vector<std::vector<std::string>> rows;
  for (int64_t batch : batches) {
    std::vector<std::string> r = {std::to_string(batch)};
    for (const auto& p : policies) {
      std::string cell = "-";
      for (const BatchDistinctRow& b : p.distinct_by_batch) {
        if (b.batch == batch) cell = Fmt(b.mean_distinct_experts, 1) + " (" + std::to_string(b.steps) + ")";
      }
      r.push_back(cell);
    }
    rows.push_back(r);
  }
  if (rows.empty()) return "";
  return "\nmean distinct experts per step at each batch size (steps); batch sizes under 1 % of every policy's steps "
         "omitted (--json has all)\n" +
         FormatTable(header, rows);
}

}  // namespace

nlohmann::json RouteReplayReport::ToJson() const {
  nlohmann::json j;
  j["num_decoders"] = num_decoders;
  j["num_requests"] = num_requests;
  j["skipped_requests"] = num_skipped;
  j["policies"] = nlohmann::json::array();
  for (const auto& p : policies) {
    nlohmann::json pj = {{"policy", p.policy},
                         {"tau", p.tau},
                         {"requests", p.requests},
                         {"mean_distinct_experts_per_step", p.mean_distinct_experts_per_step},
                         {"mean_batch", p.mean_batch},
                         {"mean_purity", p.mean_purity},
                         {"mean_band_size", p.mean_band_size},
                         {"fallbacks", p.fallbacks},
                         {"held_at_router", p.held_at_router},
                         {"max_in_flight", p.max_in_flight}};
    pj["distinct_by_batch"] = nlohmann::json::array();
    for (const BatchDistinctRow& r : p.distinct_by_batch) {
      pj["distinct_by_batch"].push_back(
          {{"batch", r.batch}, {"steps", r.steps}, {"mean_distinct_experts", r.mean_distinct_experts}});
    }
    double covered = 0;
    if (const auto ratio = MatchedVsJsq(p, &covered)) {
      pj["matched_batch_distinct_vs_jsq"] = *ratio;
      pj["matched_batch_coverage"] = covered;
    }
    pj["decoders"] = nlohmann::json::array();
    for (const auto& d : p.decoders) {
      pj["decoders"].push_back({{"requests", d.requests},
                                {"top_domain", d.top_domain},
                                {"purity", d.purity},
                                {"steps", d.steps},
                                {"mean_batch", d.mean_batch},
                                {"mean_distinct_experts", d.mean_distinct_experts}});
    }
    j["policies"].push_back(pj);
  }
  return j;
}

std::string RouteReplayReport::ToText() const {
  std::ostringstream os;
  os << num_requests << " requests routed to " << num_decoders << " decoders";
  if (num_skipped > 0) os << " (" << num_skipped << " of the trace's skipped: no prompt or no decode tokens)";
  os << "\n\n";
  double jsq = 0;
  for (const auto& p : policies) {
    if (p.policy == "jsq") jsq = p.mean_distinct_experts_per_step;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : policies) {
    std::string per;
    for (const auto& d : p.decoders) per += (per.empty() ? "" : "/") + std::to_string(d.requests);
    double covered = 0;
    const auto matched = MatchedVsJsq(p, &covered);
    rows.push_back({p.policy, Fmt(p.mean_distinct_experts_per_step, 1),
                    jsq > 0 ? Fmt(100.0 * (p.mean_distinct_experts_per_step / jsq - 1.0), 1) : "-",
                    matched && *matched > 0 ? Fmt(100.0 * (*matched - 1.0), 1) : "-", matched ? Fmt(covered, 2) : "-",
                    Fmt(p.mean_batch, 2), Fmt(p.mean_purity, 3), p.mean_band_size > 0 ? Fmt(p.mean_band_size, 2) : "-",
                    std::to_string(p.fallbacks), per});
  }
  os << "distinct = Σ over MoE layers of the experts a decode step loads; matched = at the same batch size as jsq,\n"
        "weighted by the policy's steps at each batch (covered: share of its steps at batch sizes jsq ran)\n";
  os << FormatTable({"policy", "distinct/step", "vs jsq %", "matched vs jsq %", "covered", "batch", "purity", "band",
                     "fallbacks", "requests per decoder"},
                    rows);
  os << ByBatchTable(policies);
  os << "\nper decoder: top domain and its share of the decoder's requests | mean distinct experts per step\n";
  rows.clear();
  std::vector<std::string> header = {"policy"};
  for (int k = 0; k < num_decoders; ++k) header.push_back("decoder " + std::to_string(k));
  for (const auto& p : policies) {
    std::vector<std::string> r = {p.policy};
    for (const auto& d : p.decoders) {
      r.push_back((d.top_domain.empty() ? std::string("-") : d.top_domain) + " " + Fmt(d.purity, 2) + " | " +
                  Fmt(d.mean_distinct_experts, 0));
    }
    rows.push_back(r);
  }
  os << FormatTable(header, rows);
  return os.str();
}

}  // namespace eldr
