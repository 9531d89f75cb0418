#include "runtime/job/frontend.h"

#include <algorithm>
#include <limits>

namespace eldr {

Result<Frontend> Frontend::Create(const JobConfig& c, const JobRequests& in, const TraceShape& model_shape,
                                  const Calibration* calib, FrontendActions actions, const CostModel* simulated_cost) {
  if (calib && UsesSignature(c.policy)) {
    const bool decode_calib = calib->features == SignatureFeatures::kDecode;
    if (decode_calib && !c.route_on_decode) {
      return Status::FailedPrecondition(
          c.calibration +
          ": fitted on decode tokens (eldr calibrate --features decode), an evaluation ceiling that "
          "routes on counts no router has online; use it only with 'eldr simulate --route-on decode'");
    }
    if (!decode_calib && c.route_on_decode) {
      return Status::FailedPrecondition(c.calibration +
                                        ": fitted on prefill tokens; --route-on decode needs a calibration from "
                                        "'eldr calibrate --features decode'");
    }
  }
  RouterConfig rc = JobRouterConfig(c, model_shape, in.trace);
  if (calib) {  // without one, Router::Create names what is missing
    ELDR_ASSIGN_OR_RETURN(rc.step_cost, JobStepCost(c, simulated_cost));
  }
  auto router = Router::Create(rc, calib);
  if (!router.ok()) return router.status().WithPrefix(c.calibration.empty() ? c.path : c.calibration);
  auto arrivals =
      ArrivalTimes({in.size(), c.request_rate, c.burstiness, c.workload_seed, c.Key("workload.request_rate")});
  if (!arrivals.ok()) return arrivals.status().WithPrefix(c.path);
  return Frontend(c, in, std::move(router).value(), std::move(arrivals).value(), std::move(actions));
}

Frontend::Frontend(const JobConfig& c, const JobRequests& in, Router router, std::vector<double> arrivals,
                   FrontendActions actions)
    : config_(&c),
      requests_(&in),
      router_(std::move(router)),
      arrivals_(std::move(arrivals)),
      actions_(std::move(actions)),
      records_(in.size()),
      prefill_of_(in.size(), -1),
      prefill_outstanding_(c.prefill_ranks, 0),
      routed_(in.size()),
      decoders_(c.decode_ranks) {
  for (int64_t i = 0; i < in.size(); ++i) {
    RequestRecord& r = records_[i];
    r.id = in.ReportId(i);
    r.domain = in.request(i).domain;
    r.prompt_len = in.request(i).prompt_len;
    r.token_times.reserve(static_cast<size_t>(in.output_len[i]));
  }
  for (DecoderRecord& d : decoders_) d.rank_load_sum.assign(c.ep_size, 0.0);
  free_slots_.assign(static_cast<size_t>(std::max<int64_t>(0, c.max_concurrency)),
                     -std::numeric_limits<double>::infinity());
  routing_.tau = router_.tau();
}

int64_t Frontend::DueBy(double t) const {
  return std::upper_bound(arrivals_.begin(), arrivals_.end(), t) - arrivals_.begin();
}

void Frontend::Admit(int64_t due, double now) {
  const int64_t cap = config_->max_concurrency;
  while (next_ < std::min(due, num_requests()) && (cap == 0 || active_ < cap)) {
    const int p = static_cast<int>(std::min_element(prefill_outstanding_.begin(), prefill_outstanding_.end()) -
                                   prefill_outstanding_.begin());
    if (prefill_outstanding_[p] >= kPrefillQueue) break;
    double due_at = arrivals_[next_];
    if (cap > 0) {  // the oldest free slot: the request could go once it was free and the request had arrived
      due_at = std::max(due_at, free_slots_.front());
      free_slots_.pop_front();
    }
    records_[next_].arrival = std::min(due_at, now);
    prefill_of_[next_] = p;
    ++prefill_outstanding_[p];
    ++active_;
    actions_.send_to_prefill(next_++, p);
  }
}

void Frontend::OnFirstToken(int64_t request, double t, std::optional<int32_t> token, std::vector<float> counts) {
  OnToken(request, t, token);
  --prefill_outstanding_[prefill_of_[request]];
  if (!held_.empty() || !Route(request, counts)) held_.emplace_back(request, std::move(counts));
}

void Frontend::OnToken(int64_t request, double t, std::optional<int32_t> token) {
  RequestRecord& r = records_[request];
  if (r.token_times.size() >= static_cast<size_t>(requests_->output_len[request])) return;
  if (r.decoder >= 0 && routed_[request].decoder < 0) return;  // after its finish (a late token of a failed one)
  r.token_times.push_back(t);
  if (token) r.tokens.push_back(*token);
  if (routed_[request].decoder >= 0) router_.ConsumeToken(routed_[request]);  // not after its finish
}

void Frontend::OnDecodeStep(int decoder, int64_t batch, int64_t distinct_experts, std::span<const int64_t> rank_load,
                            double balancedness) {
  if (batch <= 0) return;
  DecoderRecord& d = decoders_[decoder];
  ++d.steps;
  d.batch_sum += static_cast<double>(batch);
  d.distinct_sum += static_cast<double>(distinct_experts);
  d.by_batch.Add(batch, distinct_experts);
  if (rank_load.empty()) return;
  for (size_t r = 0; r < rank_load.size() && r < d.rank_load_sum.size(); ++r) {
    d.rank_load_sum[r] += static_cast<double>(rank_load[r]);
  }
  d.balancedness.push_back(balancedness);
}

bool Frontend::Route(int64_t request, const std::vector<float>& counts) {
  RequestRecord& r = records_[request];
  const RoutingDecision d = router_.Route(counts.data(), nullptr, r.domain);
  if (d.decoder < 0) return false;
  router_.Dispatch(d);
  routed_[request] = d;
  if (UsesSignature(config_->policy)) {
    routing_.band_sum += d.band_size;
    ++routing_.band_n;
  }
  routing_.fallbacks += d.fallback ? 1 : 0;
  r.decoder = d.decoder;
  ++decoders_[d.decoder].requests;
  actions_.send_route(request, d.decoder);
  return true;
}

void Frontend::ReleaseHeld() {
  while (!held_.empty() && Route(held_.front().first, held_.front().second)) held_.pop_front();
}

void Frontend::Finish(int64_t request, double t, bool ok, const std::string& error) {
  RequestRecord& r = records_[request];
  if (!ok && r.token_times.empty() && prefill_of_[request] >= 0) --prefill_outstanding_[prefill_of_[request]];
  r.success = ok;
  r.error = error;
  r.output_len = static_cast<int64_t>(r.token_times.size());
  if (routed_[request].decoder >= 0) {  // failed at the decoder: frees too
    router_.Complete(routed_[request]);
    routed_[request].decoder = -1;  // released: a late token or a second finish leaves the router alone
  }
  --active_;
  if (config_->max_concurrency > 0) free_slots_.push_back(t);
  ++done_;
  ReleaseHeld();
}

void Frontend::AbandonUnfinished(const std::string& never_sent, const std::string& unfinished) {
  for (int64_t i = 0; i < num_requests(); ++i) {
    RequestRecord& r = records_[i];
    if (!r.success) continue;
    const bool sent = i < next_;
    if (sent && r.token_times.size() >= static_cast<size_t>(requests_->output_len[i])) continue;
    r.success = false;
    r.error = sent ? unfinished : never_sent;
    if (!sent) r.arrival = arrivals_[i];  // its scheduled arrival: when it was (or would have been) due
    r.output_len = static_cast<int64_t>(r.token_times.size());
  }
}

std::vector<DecoderStats> Frontend::DecoderStatistics() const {
  std::vector<DecoderStats> stats(decoders_.size());
  for (size_t k = 0; k < decoders_.size(); ++k) {
    const DecoderRecord& d = decoders_[k];
    DecoderStats& s = stats[k];
    s.decoder = static_cast<int>(k);
    s.leader_rank = config_->DecoderLeaderRank(s.decoder);
    s.requests = d.requests;
    s.steps = d.steps;
    s.batch_sum = d.batch_sum;
    s.distinct_sum = d.distinct_sum;
    s.by_batch = d.by_batch;
    s.ep_size = config_->ep_size;
    if (config_->ep_size <= 1) continue;
    const double steps = static_cast<double>(d.balancedness.size());
    s.mean_rank_load = d.rank_load_sum;
    for (double& v : s.mean_rank_load) v = steps > 0 ? v / steps : 0.0;
    double sum = 0;
    for (double b : d.balancedness) sum += b;
    std::vector<double> sorted = d.balancedness;
    std::sort(sorted.begin(), sorted.end());
    s.mean_balancedness = steps > 0 ? sum / steps : 0.0;
    s.p1_balancedness = sorted.empty() ? 0.0 : Percentile(sorted, 1);
  }
  return stats;
}

}  // namespace eldr
