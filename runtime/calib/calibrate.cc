#include "runtime/calib/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>

#include "runtime/calib/balanced_kmeans.h"
#include "runtime/common/json_util.h"
#include "runtime/common/progress.h"
#include "runtime/common/signals.h"
#include "runtime/common/usable_request.h"

namespace eldr {

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string NowIso8601() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Signatures [N, D] of every request of `f` under `params`.
std::vector<float> BuildSignatures(const RequestFeatures& f, const SignatureParams& params) {
  const size_t row = f.row_size();
  const int D = params.dim();
  std::vector<float> out(static_cast<size_t>(f.num_requests) * D);
  for (int i = 0; i < f.num_requests; ++i) {
    ComputeSignature(params, f.prefill_counts.data() + i * row,
                     f.gate_sums.empty() ? nullptr : f.gate_sums.data() + i * row,
                     out.data() + static_cast<size_t>(i) * D);
  }
  return out;
}

// The features of `idx`; with kDecode the decode tokens' expert counts in place of the prompt's (--features decode):
// the exact counts, not the decode profile times its length, so a hand count matches to the bit.
RequestFeatures FeaturesFor(const TraceCounts& counts, const std::vector<int32_t>& idx, SignatureFeatures features) {
  RequestFeatures f = FeaturesFromCounts(counts, idx);
  if (features == SignatureFeatures::kPrefill) return f;
  const size_t row = f.row_size();
  f.gate_sums.clear();
  for (int i = 0; i < f.num_requests; ++i) {
    std::copy_n(counts.decode_counts.data() + static_cast<size_t>(idx[i]) * row, row,
                f.prefill_counts.data() + i * row);
  }
  return f;
}

std::vector<uint8_t> MaskFromOrder(const std::vector<int32_t>& order, int num_selected, int num_layers) {
  std::vector<uint8_t> mask(num_layers, 0);
  for (int i = 0; i < num_selected && i < static_cast<int>(order.size()); ++i) mask[order[i]] = 1;
  return mask;
}

Status ClusterInto(Calibration* c, int K, uint64_t seed, int restarts, int max_iterations, ClusterBalance balance,
                   bool progress, CalibrateReport* report) {
  const int N = c->num_signatures(), D = c->dim();
  const bool work_balanced = balance == ClusterBalance::kWork;
  if (work_balanced && c->decode_lens.empty()) {
    return Status::FailedPrecondition(
        "the calibration has no /calibration/decode_lens for work-balanced clusters; re-run 'eldr calibrate' on "
        "its trace, or refit with --balance count");
  }
  // A request's decode work is at least one step (a zero-length decode still takes its slot).
  std::vector<int64_t> weights;
  for (int64_t v : c->decode_lens) weights.push_back(std::max<int64_t>(v, 1));
  BalancedKMeansOptions ko;
  ko.weights = work_balanced ? &weights : nullptr;
  ko.num_clusters = K;
  ko.restarts = restarts;
  ko.max_iterations = max_iterations;
  ko.seed = seed;
  ko.balanced = balance != ClusterBalance::kNone;
  ko.progress = progress;
  ELDR_ASSIGN_OR_RETURN(BalancedKMeansResult km, BalancedKMeans(c->signatures, N, D, ko));
  c->num_clusters = K;
  c->seed = seed;
  c->balance = balance;
  c->centroids = std::move(km.centroids);
  c->assignment = std::move(km.assignment);
  c->sizes = km.sizes;
  c->expert_load = ClusterExpertLoad(c->decode_profiles, c->assignment, K,
                                     static_cast<size_t>(c->shape.num_layers) * c->shape.num_experts);
  c->mean_decode_len = ClusterMeanDecodeLen(c->decode_lens, c->assignment, K);
  if (report) {
    report->sizes = km.sizes;
    report->objective = km.objective;
    report->mean_within_distance = km.objective / N;
    report->iterations = km.iterations;
  }
  return Status::Ok();
}

}  // namespace

Result<Calibration> Calibrate(const Trace& trace, const CalibrateOptions& o, CalibrateReport* report) {
  const auto t0 = Clock::now();
  const TraceCounts counts = CountTrace(trace);
  const double seconds_count = Seconds(t0, Clock::now());
  auto c = Calibrate(counts, o, report);
  if (report) {  // counting is the first part of the features
    report->seconds_features += seconds_count;
    report->seconds_total += seconds_count;
  }
  return c;
}

Result<Calibration> Calibrate(const TraceCounts& counts, const CalibrateOptions& o, CalibrateReport* report) {
  CalibrateReport local;
  CalibrateReport& rep = report ? *report : local;
  rep = CalibrateReport();
  const auto t0 = Clock::now();
  if (!(o.holdout >= 0 && o.holdout < 1)) return Status::InvalidArgument("--holdout must be in [0, 1)");
  if (o.max_pairs > 0 && o.max_pairs < kMinRhoPairs) {
    return Status::InvalidArgument("--max-pairs " + std::to_string(o.max_pairs) + " is too few for a rank correlation" +
                                   " (at least " + std::to_string(kMinRhoPairs) + ", or 0 for all pairs)");
  }
  if (!(o.tau >= 0) || !std::isfinite(o.tau)) return Status::InvalidArgument("--tau must be a finite value >= 0");
  if (o.num_layers < 0 || o.num_layers > counts.shape.num_layers) {
    return Status::InvalidArgument("--layers must be 'auto' or in [1, " + std::to_string(counts.shape.num_layers) +
                                   "]");
  }
  if (o.restarts < 1) return Status::InvalidArgument("--restarts must be >= 1");
  if (o.variant == SignatureVariant::kGateProb && o.features == SignatureFeatures::kDecode) {
    return Status::InvalidArgument("--features decode works with the count variants, not --signature gate_prob");
  }
  if (o.variant == SignatureVariant::kGateProb && !counts.has_weights) {
    return Status::FailedPrecondition("--signature gate_prob needs a trace with topk_weights");
  }

  // Requests usable for calibration have prompt tokens (a signature) and decode tokens (a profile).
  std::vector<int32_t> usable;
  for (size_t i = 0; i < counts.requests.size(); ++i) {
    const auto& r = counts.requests[i];
    if (IsUsableRequest(r.prompt_len, r.decode_len())) usable.push_back(static_cast<int32_t>(i));
  }
  rep.num_skipped = static_cast<int>(counts.requests.size() - usable.size());
  if (usable.empty()) {  // say so, not "K must be in [1, 0]"
    if (counts.requests.empty()) return Status::InvalidArgument("the trace has no requests");
    return Status::InvalidArgument("none of the trace's " + std::to_string(counts.requests.size()) +
                                   " requests has both prompt and decode tokens, which calibration needs");
  }
  std::vector<int32_t> calib_idx = usable, holdout_idx;
  if (o.holdout > 0) {
    std::mt19937_64 rng(o.seed + 0x5bd1e995);
    for (size_t i = calib_idx.size(); i > 1; --i) std::swap(calib_idx[i - 1], calib_idx[rng() % i]);
    const size_t h = static_cast<size_t>(std::llround(o.holdout * static_cast<double>(calib_idx.size())));
    // Three requests make three pairs, the fewest whose rank correlation is defined.
    if (h < 3) {
      return Status::InvalidArgument("--holdout " + Fmt(o.holdout, 3) + " holds out only " + std::to_string(h) +
                                     " of " + std::to_string(calib_idx.size()) +
                                     " requests; a held-out rho needs 3: raise --holdout (or 0 for none)");
    }
    holdout_idx.assign(calib_idx.end() - h, calib_idx.end());
    calib_idx.resize(calib_idx.size() - h);
    std::sort(calib_idx.begin(), calib_idx.end());
    std::sort(holdout_idx.begin(), holdout_idx.end());
  }
  const int N = static_cast<int>(calib_idx.size());
  if (!holdout_idx.empty() && o.num_decoders >= 1 && o.num_decoders > N) {
    // The bound is the holdout's doing: say so, not "K must be in [1, 0]".
    return Status::InvalidArgument(
        "--holdout " + Fmt(o.holdout, 3) + " leaves " + std::to_string(N) + " of " + std::to_string(usable.size()) +
        " usable requests to calibrate on, fewer than K = " + std::to_string(o.num_decoders) + "; lower --holdout");
  }
  if (o.num_decoders < 1 || o.num_decoders > N) {
    return Status::InvalidArgument("--decoders K = " + std::to_string(o.num_decoders) + " must be in [1, " +
                                   std::to_string(N) + "] (the usable calibration requests)");
  }
  if (N < 3) return Status::InvalidArgument("calibration needs at least 3 requests with prompt and decode tokens");
  rep.num_requests = N;
  rep.num_holdout = static_cast<int>(holdout_idx.size());

  const int L = counts.shape.num_layers, E = counts.shape.num_experts;
  RequestFeatures fc = FeaturesFor(counts, calib_idx, o.features);
  std::vector<float> idf = ComputeIdf(fc.prefill_counts, N, L, E);
  const auto t1 = Clock::now();
  rep.seconds_features = Seconds(t0, t1);
  if (Interrupted()) return InterruptStatus();

  // ρ for every variant over all layers; greedy selection for the chosen one.
  const RequestPairs pairs = SampleRequestPairs(N, o.max_pairs, o.seed);
  rep.num_pairs = static_cast<int64_t>(pairs.size());
  rep.all_pairs = pairs.all_pairs;
  const std::vector<uint8_t> all_layers(L, 1);
  const std::vector<double> decode_ranks = SignatureQuality::DecodeRanks(fc.decode_profile, fc.row_size(), pairs);
  std::vector<std::pair<SignatureVariant, std::unique_ptr<SignatureQuality>>> evaluators;
  for (SignatureVariant v : AllSignatureVariants()) {
    auto feats = VariantFeatures(fc, v, idf);
    if (!feats.ok()) continue;  // gate_prob without weights
    evaluators.emplace_back(v, std::make_unique<SignatureQuality>(feats.value(), decode_ranks, N, L, E, pairs));
  }
  const SignatureQuality* chosen = nullptr;
  for (auto& [v, q] : evaluators) {
    if (v == o.variant) chosen = q.get();
  }
  ProgressBar bar("greedy layer selection", L, o.progress);
  GreedyLayerSelection greedy =
      chosen->SelectLayersGreedy([](void* ctx, int step) { static_cast<ProgressBar*>(ctx)->Update(step); }, &bar);
  bar.Finish();
  const int num_selected = o.num_layers > 0 ? o.num_layers : greedy.n_star;
  const std::vector<uint8_t> mask = MaskFromOrder(greedy.layer_order, num_selected, L);
  for (auto& [v, q] : evaluators) {
    rep.variants.push_back({SignatureVariantName(v), q->Rho(all_layers), q->Rho(mask)});
  }
  rep.rho_all_layers = chosen->Rho(all_layers);
  rep.rho_selected = chosen->Rho(mask);
  rep.layer_order = greedy.layer_order;
  rep.rho_curve = greedy.rho_curve;
  rep.n_star = greedy.n_star;
  rep.num_selected_layers = num_selected;
  const auto t2 = Clock::now();
  rep.seconds_quality = Seconds(t1, t2);
  if (Interrupted()) return InterruptStatus();

  Calibration c;
  c.shape = counts.shape;
  c.created = NowIso8601();
  c.signature.variant = o.variant;
  c.signature.num_layers = L;
  c.signature.num_experts = E;
  c.signature.idf = idf;
  c.signature.layer_mask = mask;
  c.layer_order = greedy.layer_order;
  c.rho_curve = greedy.rho_curve;
  c.n_star = greedy.n_star;
  c.features = o.features;
  c.signatures = BuildSignatures(fc, c.signature);
  // gate_prob signatures (sums of gate weights, no idf) are all zeros only on gate weights that are all 0, which no
  // softmax gives: no ρ could be measured and k-means would "succeed" on NaNs. (count_idf signatures of zeros are a
  // tiny trace's where every request uses every expert, idf 0: read as "no locality", see calibration.cc.)
  if (o.variant == SignatureVariant::kGateProb &&
      std::all_of(c.signatures.begin(), c.signatures.end(), [](float x) { return x == 0.0f; })) {
    return Status::InvalidArgument(
        "every request's gate_prob signature is all zeros: the trace's /tokens/topk_weights are all 0 on the "
        "selected layers' prompt tokens, which are not gate probabilities; check the trace or use --signature "
        "count_idf");
  }
  for (int32_t i : calib_idx) {
    c.request_ids.push_back(counts.requests[i].id);
    c.domains.push_back(counts.requests[i].domain);
    c.decode_lens.push_back(counts.requests[i].decode_len());
  }
  c.decode_profiles = fc.decode_profile;
  c.tau = o.tau;
  ELDR_RETURN_IF_ERROR(
      ClusterInto(&c, o.num_decoders, o.seed, o.restarts, o.max_iterations, o.balance, o.progress, &rep));
  const auto t3 = Clock::now();
  rep.seconds_kmeans = Seconds(t2, t3);

  rep.rho_holdout = kNaN;
  if (!holdout_idx.empty()) {
    RequestFeatures fh = FeaturesFor(counts, holdout_idx, o.features);
    ELDR_ASSIGN_OR_RETURN(std::vector<float> feats, VariantFeatures(fh, o.variant, idf));
    const RequestPairs hp = SampleRequestPairs(fh.num_requests, o.max_pairs, o.seed + 1);
    SignatureQuality hq(feats, fh.decode_profile, fh.num_requests, L, E, hp);
    rep.rho_holdout = hq.Rho(mask);
  }
  rep.seconds_total = Seconds(t0, Clock::now());
  return c;
}

Result<Calibration> Refit(const Calibration& calib, int num_decoders, uint64_t seed, int restarts,
                          ClusterBalance balance, bool progress, CalibrateReport* report) {
  if (calib.decode_profiles.empty()) {
    return Status::FailedPrecondition("the calibration has no /calibration/decode_profiles; re-run 'eldr calibrate'");
  }
  const int N = calib.num_signatures();
  if (num_decoders < 1 || num_decoders > N) {
    return Status::InvalidArgument("--decoders K = " + std::to_string(num_decoders) + " must be in [1, " +
                                   std::to_string(N) + "] (the stored calibration signatures)");
  }
  const auto t0 = Clock::now();
  Calibration c = calib;
  c.created = NowIso8601();
  CalibrateReport local;
  CalibrateReport& rep = report ? *report : local;
  rep = CalibrateReport();
  rep.num_requests = N;
  rep.rho_curve = calib.rho_curve;
  rep.layer_order = calib.layer_order;
  rep.n_star = calib.n_star;
  rep.num_selected_layers = calib.signature.num_selected_layers();
  rep.rho_all_layers = rep.rho_selected = rep.rho_holdout = kNaN;
  ELDR_RETURN_IF_ERROR(ClusterInto(&c, num_decoders, seed, restarts, 100, balance, progress, &rep));
  rep.seconds_kmeans = rep.seconds_total = Seconds(t0, Clock::now());
  return c;
}

Result<TraceCheck> CheckTraceAgainstCalibration(const Calibration& calib, const Trace& trace,
                                                const std::string& trace_name, const std::string& calib_name,
                                                int64_t max_pairs, uint64_t seed) {
  if (!trace.shape.SameAs(calib.shape)) {
    return Status::FailedPrecondition(trace_name + ": model shape " + trace.shape.ToString() + " differs from " +
                                      calib_name + " (" + calib.shape.ToString() + ")");
  }
  std::vector<int32_t> usable;
  for (size_t i = 0; i < trace.requests.size(); ++i) {
    if (IsUsableRequest(trace.requests[i].prompt_len, trace.requests[i].decode_len()))
      usable.push_back(static_cast<int32_t>(i));
  }
  if (usable.size() < 3)
    return Status::InvalidArgument(trace_name + ": fewer than 3 requests with prompt and decode tokens");
  if (calib.signature.variant == SignatureVariant::kGateProb && !trace.has_weights()) {
    return Status::FailedPrecondition(trace_name +
                                      ": the calibration uses gate_prob signatures but the trace has no weights");
  }
  RequestFeatures f = ComputeRequestFeatures(trace, usable);
  TraceCheck out;
  out.num_requests = f.num_requests;
  ELDR_ASSIGN_OR_RETURN(std::vector<float> feats, VariantFeatures(f, calib.signature.variant, calib.signature.idf));
  SignatureQuality q(feats, f.decode_profile, f.num_requests, f.num_layers, f.num_experts,
                     SampleRequestPairs(f.num_requests, max_pairs, seed));
  out.rho = q.Rho(calib.signature.layer_mask);
  const std::vector<float> sig = BuildSignatures(f, calib.signature);
  const int D = calib.dim(), K = calib.num_clusters;
  out.nearest_centroid_counts.assign(K, 0);
  for (int i = 0; i < f.num_requests; ++i) {
    int best = 0;
    double best_sim = -2;
    for (int k = 0; k < K; ++k) {
      double s = 0;
      for (int x = 0; x < D; ++x)
        s += static_cast<double>(sig[static_cast<size_t>(i) * D + x]) * calib.centroids[static_cast<size_t>(k) * D + x];
      if (s > best_sim) {
        best_sim = s;
        best = k;
      }
    }
    ++out.nearest_centroid_counts[best];
  }
  return out;
}

nlohmann::json TraceCheck::ToJson() const {
  return {{"num_requests", num_requests}, {"rho", rho}, {"nearest_centroid_counts", nearest_centroid_counts}};
}

namespace {
nlohmann::json NumOrNull(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
}  // namespace

nlohmann::json CalibrateReport::ToJson() const {
  nlohmann::json j;
  j["num_requests"] = num_requests;
  j["num_holdout"] = num_holdout;
  j["num_skipped"] = num_skipped;
  j["num_pairs"] = num_pairs;
  j["all_pairs"] = all_pairs;
  nlohmann::json vs = nlohmann::json::array();
  for (const auto& v : variants) {
    vs.push_back({{"variant", v.variant},
                  {"rho_all_layers", NumOrNull(v.rho_all_layers)},
                  {"rho_selected", NumOrNull(v.rho_selected)}});
  }
  j["variants"] = vs;
  j["rho_all_layers"] = NumOrNull(rho_all_layers);
  j["rho_selected"] = NumOrNull(rho_selected);
  j["rho_holdout"] = NumOrNull(rho_holdout);
  j["layer_order"] = layer_order;
  nlohmann::json curve = nlohmann::json::array();
  for (double r : rho_curve) curve.push_back(NumOrNull(r));
  j["rho_curve"] = curve;
  j["n_star"] = n_star;
  j["num_selected_layers"] = num_selected_layers;
  j["cluster_sizes"] = sizes;
  j["mean_within_cluster_distance"] = mean_within_distance;
  j["objective"] = objective;
  j["iterations"] = iterations;
  j["seconds"] = {{"features", seconds_features}, {"quality", seconds_quality}, {"kmeans", seconds_kmeans},
                  {"total", seconds_total},       {"read", seconds_read},       {"write", seconds_write}};
  return j;
}

std::string CalibrateReport::ToText() const {
  std::ostringstream os;
  os << "calibration requests: " << num_requests;
  if (num_holdout) os << "  held out: " << num_holdout;
  if (num_skipped) os << "  skipped (no prompt or no decode tokens): " << num_skipped;
  os << "\n";
  if (!variants.empty()) {
    os << "\nsignature quality rho (Spearman, " << num_pairs << (all_pairs ? " pairs, all" : " sampled pairs") << ")\n";
    std::vector<std::vector<std::string>> rows;
    for (const auto& v : variants) rows.push_back({v.variant, Fmt(v.rho_all_layers, 4), Fmt(v.rho_selected, 4)});
    os << FormatTable({"variant", "rho (all layers)", "rho (selected layers)"}, rows);
  }
  if (!rho_curve.empty()) {
    os << "\ngreedy layer selection: N* = " << n_star << " of " << rho_curve.size() << " layers, using "
       << num_selected_layers << "\n";
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < rho_curve.size(); ++i) {
      rows.push_back({std::to_string(i + 1), std::to_string(layer_order[i]), Fmt(rho_curve[i], 4),
                      static_cast<int>(i + 1) == n_star ? "<- N*" : ""});
    }
    os << FormatTable({"step", "layer", "rho", ""}, rows);
  }
  if (std::isfinite(rho_all_layers)) {
    os << "\nrho: all layers " << Fmt(rho_all_layers, 4) << ", selected " << Fmt(rho_selected, 4) << " (gain "
       << Fmt(rho_selected - rho_all_layers, 4) << ")";
    if (std::isfinite(rho_holdout)) os << ", held-out " << Fmt(rho_holdout, 4);
    os << "\n";
  }
  os << "\nclusters: K = " << sizes.size() << ", sizes";
  for (auto s : sizes) os << " " << s;
  os << "\nmean within-cluster cosine distance: " << Fmt(mean_within_distance, 4) << " (" << iterations
     << " iterations)\n";
  os << "time: read " << Fmt(seconds_read, 3) << " s, fit " << Fmt(seconds_total, 3) << " s (features "
     << Fmt(seconds_features, 3) << ", rho + greedy " << Fmt(seconds_quality, 3) << ", k-means "
     << Fmt(seconds_kmeans, 3) << "), write " << Fmt(seconds_write, 3) << " s\n";
  return os.str();
}

nlohmann::json CalibrationSummaryJson(const Calibration& c) {
  nlohmann::json j;
  j["format"] = kCalibrationFormat;
  j["format_version"] = kCalibrationFormatVersion;
  j["model"] = c.shape.model;
  j["num_layers"] = c.shape.num_layers;
  j["num_experts"] = c.shape.num_experts;
  j["top_k"] = c.shape.top_k;
  j["created"] = c.created;
  j["variant"] = SignatureVariantName(c.signature.variant);
  j["features"] = SignatureFeaturesName(c.features);
  std::vector<int> layers;
  for (int l = 0; l < c.shape.num_layers; ++l) {
    if (c.signature.layer_mask[l]) layers.push_back(l);
  }
  j["selected_layers"] = layers;
  j["n_star"] = c.n_star;
  j["signature_dim"] = c.dim();
  nlohmann::json curve = nlohmann::json::array();
  for (double r : c.rho_curve) curve.push_back(NumOrNull(r));
  j["rho_curve"] = curve;
  j["num_signatures"] = c.num_signatures();
  j["K"] = c.num_clusters;
  j["tau"] = c.tau;
  j["seed"] = c.seed;
  j["balance"] = ClusterBalanceName(c.balance);
  j["cluster_sizes"] = c.sizes;
  // Domain composition of each cluster.
  nlohmann::json comp = nlohmann::json::array();
  for (int k = 0; k < c.num_clusters; ++k) {
    std::map<std::string, int> counts;
    for (size_t i = 0; i < c.assignment.size(); ++i) {
      if (c.assignment[i] == k) ++counts[c.domains[i].empty() ? "(none)" : c.domains[i]];
    }
    comp.push_back(counts);
  }
  j["cluster_domains"] = comp;
  // Mean within-cluster cosine distance from the stored signatures and centroids.
  const int D = c.dim();
  double total = 0;
  for (size_t i = 0; i < c.assignment.size(); ++i) {
    double s = 0;
    for (int x = 0; x < D; ++x)
      s += static_cast<double>(c.signatures[i * D + x]) * c.centroids[static_cast<size_t>(c.assignment[i]) * D + x];
    total += 1.0 - s;
  }
  j["mean_within_cluster_distance"] = c.assignment.empty() ? 0.0 : total / c.assignment.size();
  j["has_decode_profiles"] = !c.decode_profiles.empty();
  return j;
}

std::string DescribeCalibration(const Calibration& c) {
  const nlohmann::json j = CalibrationSummaryJson(c);
  std::ostringstream os;
  os << "calibration: model '" << c.shape.model << "' (" << c.shape.ToString() << "), created " << c.created << "\n";
  os << "signature: " << SignatureVariantName(c.signature.variant) << ", " << c.signature.num_selected_layers()
     << " of " << c.shape.num_layers << " layers (N* = " << c.n_star << "), D = " << c.dim() << "; layers";
  for (int l : j["selected_layers"]) os << " " << l;
  os << "\n";
  if (c.features == SignatureFeatures::kDecode) {
    os << "features: decode tokens (an evaluation ceiling: only 'eldr simulate --route-on decode' routes with it)\n";
  }
  if (!c.rho_curve.empty() && c.n_star >= 1) {
    os << "rho: all layers " << Fmt(c.rho_curve.back(), 4) << ", at N* " << Fmt(c.rho_curve[c.n_star - 1], 4) << "\n";
  }
  os << "clusters: K = " << c.num_clusters << ", tau = " << c.tau << ", seed = " << c.seed << ", "
     << DescribeBalance(c.balance) << ", " << c.num_signatures() << " signatures, mean within-cluster distance "
     << Fmt(j["mean_within_cluster_distance"].get<double>(), 4) << "\n\n";
  std::vector<std::vector<std::string>> rows;
  for (int k = 0; k < c.num_clusters; ++k) {
    std::string comp;
    for (auto& [d, n] : j["cluster_domains"][k].items())
      comp += (comp.empty() ? "" : ", ") + d + " " + std::to_string(n.get<int>());
    rows.push_back({std::to_string(k), std::to_string(c.sizes[k]), comp});
  }
  os << FormatTable({"cluster", "size", "domains"}, rows);
  return os.str();
}

}  // namespace eldr
