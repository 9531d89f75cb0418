// The offline calibration pipeline (DESIGN.md §2): trace → per-request counts → IDF → ρ per variant →
// greedy layer selection → signatures → balanced k-means (by decode work or by count) → calibration.h5 contents.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/calib/calibration.h"
#include "runtime/signature/quality.h"
#include "runtime/trace/trace.h"

namespace eldr {

// The fewest sampled request pairs `--max-pairs` may ask for: a rank correlation over fewer is noise (one pair has
// none at all).
inline constexpr int64_t kMinRhoPairs = 100;

struct CalibrateOptions {
  int num_decoders = 4;  // K
  SignatureVariant variant = SignatureVariant::kCountIdf;
  int num_layers = 0;  // |S|: 0 = auto (N*, where ρ peaks)
  double tau = 0.1;    // stored for the router
  uint64_t seed = 0;
  int restarts = 4;
  int max_iterations = 100;
  double holdout = 0;         // fraction of requests kept out of calibration
  int64_t max_pairs = 20000;  // ρ pair sample; <= 0 = all pairs, else at least kMinRhoPairs
  // The clusters' capacity (Calibration::balance): by expected decode work, Σ decode tokens (the default), by
  // request count (the published calibration) or none (plain spherical k-means, ablation).
  ClusterBalance balance = ClusterBalance::kWork;
  // kDecode: IDF, ρ, layer selection, signatures and clusters from each request's decode-token counts instead of
  // its prompt's (the clairvoyant ceiling of evaluation, Calibration::features). Not with gate_prob.
  SignatureFeatures features = SignatureFeatures::kPrefill;
  bool progress = true;
};

struct VariantRho {
  std::string variant;
  double rho_all_layers = 0;
  double rho_selected = 0;  // with the chosen variant's layer mask
};

struct CalibrateReport {
  int num_requests = 0;  // calibration set
  int num_holdout = 0;
  int num_skipped = 0;  // requests with no prompt or no decode tokens (not usable)
  int64_t num_pairs = 0;
  bool all_pairs = true;
  std::vector<VariantRho> variants;
  double rho_all_layers = 0;  // chosen variant, every layer
  double rho_selected = 0;    // chosen variant, layer mask
  double rho_holdout = 0;     // NaN without holdout
  std::vector<int32_t> layer_order;
  std::vector<double> rho_curve;
  int n_star = 0;
  int num_selected_layers = 0;
  std::vector<int64_t> sizes;
  double mean_within_distance = 0;  // mean cosine distance of a signature to its centroid
  double objective = 0;
  int iterations = 0;
  double seconds_features = 0, seconds_quality = 0, seconds_kmeans = 0, seconds_total = 0;  // the fit (total: all)
  // Set by the command around the fit: reading the trace (or the calibration of --refit), writing calibration.h5.
  double seconds_read = 0, seconds_write = 0;

  nlohmann::json ToJson() const;
  std::string ToText() const;
};

// Runs the whole pipeline. InvalidArgument for K < 1, K > usable requests, bad holdout, etc.
Result<Calibration> Calibrate(const Trace& trace, const CalibrateOptions& options, CalibrateReport* report);
// The same from the trace's per-request counts (ReadTraceCounts: what `eldr calibrate` reads); the same result bit
// for bit as Calibrate(trace) when counts = CountTrace(trace). gate_prob needs counts with gate sums.
Result<Calibration> Calibrate(const TraceCounts& counts, const CalibrateOptions& options, CalibrateReport* report);

// Offline reconfiguration: re-clusters the stored signatures for K' decoders (centroids, assignment,
// sizes, expert load, mean decode length), keeping IDF, mask and signatures. ClusterBalance::kWork needs the
// stored /calibration/decode_lens (FailedPrecondition without them).
Result<Calibration> Refit(const Calibration& calib, int num_decoders, uint64_t seed, int restarts,
                          ClusterBalance balance, bool progress, CalibrateReport* report);

// How a calibration describes a (new) trace: ρ of its signatures on the trace's requests, and where
// the nearest centroid would put them. FailedPrecondition when the model shapes differ.
struct TraceCheck {
  int num_requests = 0;
  double rho = 0;
  std::vector<int64_t> nearest_centroid_counts;  // [K]
  nlohmann::json ToJson() const;
};
Result<TraceCheck> CheckTraceAgainstCalibration(const Calibration& calib, const Trace& trace,
                                                const std::string& trace_name, const std::string& calib_name,
                                                int64_t max_pairs, uint64_t seed);

// A readable multi-line summary of a calibration file (eldr inspect) and its JSON form.
std::string DescribeCalibration(const Calibration& calib);
nlohmann::json CalibrationSummaryJson(const Calibration& calib);

}  // namespace eldr
