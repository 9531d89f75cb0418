#include "runtime/eval/placement_replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "runtime/common/check.h"
#include "runtime/common/json_util.h"
#include "runtime/common/signals.h"
#include "runtime/common/usable_request.h"
#include "runtime/router/router.h"
#include "runtime/signature/signature.h"

namespace eldr {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// numpy.percentile with method "linear": rank p/100 · (n − 1), interpolated between neighbours.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (rank - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// Per-step values of one placement, accumulated over a set of steps.
struct StepSeries {
  std::vector<double> balancedness;
  std::vector<double> max_rank_load;

  void Add(const RankLoadSummary& s) {
    balancedness.push_back(s.balancedness());
    max_rank_load.push_back(s.mean_max_rank_load());
  }
  void Append(const StepSeries& o) {
    balancedness.insert(balancedness.end(), o.balancedness.begin(), o.balancedness.end());
    max_rank_load.insert(max_rank_load.end(), o.max_rank_load.begin(), o.max_rank_load.end());
  }
  StepBalance Summarize() const {
    StepBalance b;
    if (balancedness.empty()) {
      b.mean_balancedness = b.p1_balancedness = b.mean_max_rank_load = kNaN;
      return b;
    }
    double sum_b = 0, sum_m = 0;
    for (double x : balancedness) sum_b += x;
    for (double x : max_rank_load) sum_m += x;
    b.mean_balancedness = sum_b / static_cast<double>(balancedness.size());
    b.p1_balancedness = Percentile(balancedness, 1);
    b.mean_max_rank_load = sum_m / static_cast<double>(max_rank_load.size());
    return b;
  }
};

Status CheckPlacementShape(const Placement& pl, const Calibration& calib, int num_ranks, const std::string& what) {
  const int L = calib.shape.num_layers, E = calib.shape.num_experts;
  if (pl.num_layers != L || pl.num_experts != E || pl.num_ranks != num_ranks || pl.num_slots < E ||
      pl.num_slots % num_ranks != 0 || pl.phy2log.size() != static_cast<size_t>(L) * pl.num_slots ||
      pl.logcnt.size() != static_cast<size_t>(L) * E) {
    return Status::InvalidArgument(what + " placement is [L = " + std::to_string(pl.num_layers) +
                                   ", E = " + std::to_string(pl.num_experts) + ", P = " + std::to_string(pl.num_slots) +
                                   ", R = " + std::to_string(pl.num_ranks) + "], expected L = " + std::to_string(L) +
                                   ", E = " + std::to_string(E) + ", R = " + std::to_string(num_ranks));
  }
  return Status::Ok();
}

nlohmann::json NumOrNull(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json BalanceJson(const StepBalance& b) {
  return {{"mean_balancedness", NumOrNull(b.mean_balancedness)},
          {"p1_balancedness", NumOrNull(b.p1_balancedness)},
          {"mean_max_rank_load", NumOrNull(b.mean_max_rank_load)}};
}

nlohmann::json ClusterJson(const ClusterReplay& c) {
  nlohmann::json j = {{"requests", c.requests},
                      {"decode_tokens", c.decode_tokens},
                      {"steps", c.steps},
                      {"contiguous", BalanceJson(c.contiguous)},
                      {"global", BalanceJson(c.global)},
                      {"per_cluster", BalanceJson(c.per_cluster)}};
  if (c.cluster >= 0) j["cluster"] = c.cluster;
  return j;
}

std::string Cell(double v, int decimals) { return std::isfinite(v) ? Fmt(v, decimals) : std::string("-"); }

}  // namespace

Result<ComparedPlacements> PlaceForEvaluation(const Calibration& calib, const PlacementSpec& spec,
                                              const std::string& calib_name, const PlaceHooks* hooks) {
  ComparedPlacements out;
  auto contiguous = ContiguousPlacement(calib.shape.num_layers, calib.shape.num_experts, spec.num_ranks);
  if (!contiguous.ok()) return contiguous.status().WithPrefix(calib_name);
  out.contiguous = std::move(contiguous).value();
  auto placed = PlaceClusters(calib, spec, hooks);
  if (!placed.ok()) return placed.status().WithPrefix(calib_name);
  out.global = std::move(placed.value().global);
  out.per_cluster = std::move(placed.value().per_cluster);
  out.source = std::string("placed now with ") + PlacementAlgorithmName(spec.algorithm);
  return out;
}

std::vector<std::vector<int64_t>> FormDecodeSteps(const Trace& trace, const std::vector<int32_t>& request_indices,
                                                  int batch_size) {
  std::vector<std::vector<int64_t>> steps;
  std::vector<int64_t> current;
  int64_t max_len = 0;
  for (int32_t i : request_indices) max_len = std::max(max_len, trace.requests[i].decode_len());
  for (int64_t t = 0; t < max_len; ++t) {
    for (int32_t i : request_indices) {
      const TraceRequest& r = trace.requests[i];
      if (t >= r.decode_len()) continue;
      current.push_back(r.offset + r.prompt_len + t);
      if (static_cast<int>(current.size()) == batch_size) {
        steps.push_back(std::move(current));
        current.clear();
      }
    }
  }
  if (!current.empty() && steps.empty()) steps.push_back(std::move(current));
  return steps;
}

Result<PlacementReplayReport> ReplayPlacements(const Trace& trace, const Calibration& calib,
                                               const ComparedPlacements& placements, const PlacementReplayOptions& o,
                                               const std::string& trace_name, const std::string& calib_name) {
  if (!trace.shape.SameAs(calib.shape)) {
    return Status::FailedPrecondition(trace_name + ": model shape " + trace.shape.ToString() + " differs from " +
                                      calib_name + " (" + calib.shape.ToString() + ")");
  }
  if (calib.signature.variant == SignatureVariant::kGateProb && !trace.has_weights()) {
    return Status::FailedPrecondition(trace_name +
                                      ": the calibration uses gate_prob signatures but the trace has no weights");
  }
  if (o.batch_size < 1) {
    return Status::InvalidArgument("--batch must be >= 1, got " + std::to_string(o.batch_size));
  }
  const int K = calib.num_clusters, L = calib.shape.num_layers, E = calib.shape.num_experts;
  const int k_top = calib.shape.top_k;
  const int R = placements.contiguous.num_ranks;
  if (static_cast<int>(placements.per_cluster.size()) != K) {
    return Status::InvalidArgument(std::to_string(placements.per_cluster.size()) +
                                   " per-cluster placements for K = " + std::to_string(K) + " clusters");
  }
  ELDR_RETURN_IF_ERROR(CheckPlacementShape(placements.contiguous, calib, R, "contiguous"));
  ELDR_RETURN_IF_ERROR(CheckPlacementShape(placements.global, calib, R, "global"));
  for (int k = 0; k < K; ++k) {
    ELDR_RETURN_IF_ERROR(CheckPlacementShape(placements.per_cluster[k], calib, R, "cluster " + std::to_string(k)));
  }

  // 1. Requests.
  const std::set<std::string> members(calib.request_ids.begin(), calib.request_ids.end());
  PlacementReplayReport rep;
  std::vector<int32_t> evaluated;
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    const TraceRequest& r = trace.requests[i];
    const bool member = members.count(r.id) > 0;
    if (!IsUsableRequest(r.prompt_len, r.decode_len())) {
      ++rep.num_unusable;
      continue;
    }
    if (o.holdout_only && member) {
      ++rep.num_members_left_out;
      continue;
    }
    rep.num_calibration_members += member;
    evaluated.push_back(static_cast<int32_t>(i));
  }
  if (evaluated.empty() && o.holdout_only) {
    return Status::InvalidArgument(trace_name +
                                   ": no held-out request (every request with prompt and decode tokens "
                                   "is a member of " +
                                   calib_name + ")");
  }
  if (evaluated.empty()) return Status::InvalidArgument(trace_name + ": no request has both prompt and decode tokens");

  // 2. Decoder of each request: the nearest centroid.
  RouterConfig rc;
  rc.policy = RoutingPolicy::kLocalityTop1;
  rc.num_decoders = K;
  rc.job_shape = trace.shape;
  auto router_or = Router::Create(rc, &calib);
  if (!router_or.ok()) return router_or.status().WithPrefix(calib_name);
  Router router = std::move(router_or).value();
  const RequestFeatures f = ComputeRequestFeatures(trace, evaluated);
  const size_t row = f.row_size();
  std::vector<std::vector<int32_t>> members_of(K);
  for (int n = 0; n < f.num_requests; ++n) {
    const int32_t i = evaluated[n];
    const RoutingDecision d =
        router.Route(f.prefill_counts.data() + n * row, f.gate_sums.empty() ? nullptr : f.gate_sums.data() + n * row,
                     trace.requests[i].domain);
    ELDR_CHECK(d.decoder >= 0 && d.decoder < K, "locality_top1 without a cap chose decoder " << d.decoder);
    members_of[d.decoder].push_back(i);
  }

  // 3-5. Steps, loads, statistics.
  rep.trace_name = trace_name;
  rep.calib_name = calib_name;
  rep.placement_source = placements.source;
  rep.num_clusters = K;
  rep.num_layers = L;
  rep.num_experts = E;
  rep.top_k = k_top;
  rep.num_ranks = R;
  rep.num_slots = placements.global.num_slots;
  rep.batch_size = o.batch_size;
  rep.holdout_only = o.holdout_only;
  rep.num_requests = static_cast<int64_t>(evaluated.size());
  rep.balanced_max_rank_load = static_cast<double>(o.batch_size) * k_top / R;
  std::vector<double> load(row, 0.0);  // [L, E] activations of one step
  StepSeries all_contiguous, all_global, all_per_cluster;
  for (int k = 0; k < K; ++k) {
    ClusterReplay c;
    c.cluster = k;
    c.requests = static_cast<int64_t>(members_of[k].size());
    for (int32_t i : members_of[k]) c.decode_tokens += trace.requests[i].decode_len();
    const std::vector<std::vector<int64_t>> steps = FormDecodeSteps(trace, members_of[k], o.batch_size);
    c.steps = static_cast<int64_t>(steps.size());
    StepSeries contiguous, global, per_cluster;
    for (const std::vector<int64_t>& step : steps) {
      if (Interrupted()) return InterruptStatus();
      std::fill(load.begin(), load.end(), 0.0);
      for (int64_t t : step) {
        const uint16_t* ids = trace.token_ids(t);  // [L, k]
        for (int l = 0; l < L; ++l) {
          for (int j = 0; j < k_top; ++j) load[static_cast<size_t>(l) * E + ids[l * k_top + j]] += 1.0;
        }
      }
      contiguous.Add(SummarizeRankLoad(placements.contiguous, load.data()));
      global.Add(SummarizeRankLoad(placements.global, load.data()));
      per_cluster.Add(SummarizeRankLoad(placements.per_cluster[k], load.data()));
    }
    c.contiguous = contiguous.Summarize();
    c.global = global.Summarize();
    c.per_cluster = per_cluster.Summarize();
    all_contiguous.Append(contiguous);
    all_global.Append(global);
    all_per_cluster.Append(per_cluster);
    rep.overall.requests += c.requests;
    rep.overall.decode_tokens += c.decode_tokens;
    rep.overall.steps += c.steps;
    rep.clusters.push_back(c);
  }
  rep.overall.contiguous = all_contiguous.Summarize();
  rep.overall.global = all_global.Summarize();
  rep.overall.per_cluster = all_per_cluster.Summarize();
  return rep;
}

nlohmann::json PlacementReplayReport::ToJson() const {
  nlohmann::json j = {{"trace", trace_name},
                      {"calib", calib_name},
                      {"placements", placement_source},
                      {"num_clusters", num_clusters},
                      {"num_layers", num_layers},
                      {"num_experts", num_experts},
                      {"top_k", top_k},
                      {"num_ranks", num_ranks},
                      {"num_slots", num_slots},
                      {"batch_size", batch_size},
                      {"requests", holdout_only ? "held-out" : "all"},
                      {"num_requests", num_requests},
                      {"num_calibration_members", num_calibration_members},
                      {"num_members_left_out", num_members_left_out},
                      {"num_unusable", num_unusable},
                      {"balanced_max_rank_load", balanced_max_rank_load},
                      {"overall", ClusterJson(overall)}};
  j["clusters"] = nlohmann::json::array();
  for (const ClusterReplay& c : clusters) j["clusters"].push_back(ClusterJson(c));
  return j;
}

std::string PlacementReplayReport::ToText() const {
  std::ostringstream os;
  os << "# eldr place evaluate: " << trace_name << " on the K = " << num_clusters << " decoder clusters of "
     << calib_name << "\n";
  os << "# requests: " << num_requests
     << (holdout_only ? " held out (not calibration members)" : " (every usable one)");
  if (num_calibration_members > 0) os << ", " << num_calibration_members << " of them calibration members (in-sample)";
  if (holdout_only) os << "; " << num_members_left_out << " calibration members left out";
  os << "; " << num_unusable << " without prompt or decode tokens\n";
  os << "# EP group: R = " << num_ranks << " ranks; global and per-cluster: P = " << num_slots << " slots, "
     << placement_source << "; contiguous: P = E = " << num_experts << "\n";
  os << "# decode step: " << batch_size
     << " tokens, round-robin over the cluster's requests; balancedness = "
        "sum_l mean rank load / sum_l max rank load; max-rank load in activations per layer (balanced: "
     << Fmt(balanced_max_rank_load, 2) << ")\n";
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const ClusterReplay& c) {
    const std::string name = c.cluster >= 0 ? "cluster " + std::to_string(c.cluster) : std::string("all");
    const std::pair<const char*, const StepBalance*> kinds[] = {
        {"contiguous", &c.contiguous}, {"global", &c.global}, {"per-cluster", &c.per_cluster}};
    bool first = true;
    for (const auto& [kind, b] : kinds) {
      rows.push_back({first ? name : "", first ? std::to_string(c.requests) : "", first ? std::to_string(c.steps) : "",
                      kind, Cell(b->mean_balancedness, 4), Cell(b->p1_balancedness, 4),
                      Cell(b->mean_max_rank_load, 2)});
      first = false;
    }
  };
  for (const ClusterReplay& c : clusters) add(c);
  add(overall);
  os << FormatTable(
      {"cluster", "requests", "steps", "placement", "mean balancedness", "p1 balancedness", "max-rank load"}, rows);
  return os.str();
}

}  // namespace eldr
