// calibration.h5 (DESIGN.md §5): everything the router needs (IDF, layer mask, centroids) plus what
// offline reconfiguration needs (the calibration signatures and decode profiles), so that
// `eldr calibrate --refit` works without the trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/atomic_file.h"
#include "runtime/common/status.h"
#include "runtime/signature/signature.h"
#include "runtime/trace/trace.h"

namespace eldr {

inline constexpr const char* kCalibrationFormat = "eldr-calibration";
inline constexpr int64_t kCalibrationFormatVersion = 1;

// The tokens a calibration's IDF, layer selection, signatures and clusters were computed from (attribute
// /signature/features; "prefill" when absent): the prompt's, what a router sees online, or the decode tokens'
// (`eldr calibrate --features decode`), an evaluation option: the ceiling of any signature, which only
// `eldr simulate --route-on decode` may route with (job/frontend.h refuses the mismatch either way).
enum class SignatureFeatures { kPrefill, kDecode };
const char* SignatureFeaturesName(SignatureFeatures f);  // "prefill", "decode"
Result<SignatureFeatures> ParseSignatureFeatures(const std::string& name);

// What the clusters' capacity counts (DESIGN.md §3 "Work-balanced k-means"; attributes /clusters/balanced and
// /clusters/work_balanced): kWork, the default, balances each cluster's expected decode work (Σ of its members' decode
// tokens, the min-cost-flow relaxation of WeightedCapacitatedAssignment); kCount balances request counts (Hungarian,
// the published calibration); kNone is plain spherical k-means (an ablation).
enum class ClusterBalance { kNone, kCount, kWork };
const char* ClusterBalanceName(ClusterBalance b);  // "none", "count", "work"
// For people: "balanced by decode work", "balanced by request count", "unbalanced (plain spherical k-means)".
std::string DescribeBalance(ClusterBalance b);
Result<ClusterBalance> ParseClusterBalance(const std::string& name);

// The longest decode length a calibration holds (2^31 − 1 tokens; ValidateCalibration).
inline constexpr int64_t kMaxDecodeLen = 2147483647;
// The largest IDF weight a calibration holds (log(N + 1) < 44 for any trace; ValidateCalibration).
inline constexpr float kMaxIdf = 64.0f;

struct Calibration {
  TraceShape shape;
  std::string created;  // ISO 8601 UTC

  // /signature
  SignatureParams signature;                                 // variant, idf [L, E], layer_mask [L]
  std::vector<int32_t> layer_order;                          // [L] greedy order
  std::vector<double> rho_curve;                             // [L] ρ after each greedy step
  int n_star = 0;                                            // attribute of /signature
  SignatureFeatures features = SignatureFeatures::kPrefill;  // attribute of /signature

  // /calibration
  std::vector<float> signatures;         // [N, D], D = signature.dim()
  std::vector<std::string> request_ids;  // [N]
  std::vector<std::string> domains;      // [N]
  std::vector<float> decode_profiles;    // [N, L, E] d_r, for the per-cluster load on refit
  // [N] decode tokens of each request (optional dataset /calibration/decode_lens; empty in files written
  // before it): the weights of work-balanced clustering and the per-cluster prior below.
  std::vector<int64_t> decode_lens;  // each in [0, kMaxDecodeLen]

  // /clusters
  int num_clusters = 0;  // K
  double tau = 0.1;
  uint64_t seed = 0;
  // attributes balanced and work_balanced (the latter written with decode_lens, and only then: kCount without it)
  ClusterBalance balance = ClusterBalance::kCount;
  std::vector<float> centroids;     // [K, D]
  std::vector<int32_t> assignment;  // [N]
  std::vector<int64_t> sizes;       // [K]
  std::vector<float> expert_load;   // [K, L, E] mean decode profile of the cluster's members
  // [K] mean decode tokens of the cluster's members (optional dataset /clusters/mean_decode_len, written when
  // decode_lens is known; empty otherwise): the router's prior of a request's decode length where the calibration
  // has no decode_lens (DecodeLengthPrior).
  std::vector<double> mean_decode_len;

  int num_signatures() const { return static_cast<int>(request_ids.size()); }
  int dim() const { return signature.dim(); }
};

// How the large datasets of calibration.h5 are stored. Each is chunked (about 1 MiB of whole rows) with an
// optional shuffle and deflate at a level in [1, 9]; the chunks are compressed on `num_threads` threads (<= 0:
// DefaultThreads()) and written by direct chunk writes (h5::File::Write), readable by any HDF5 reader. The
// defaults were measured on the paper-scale calibration (bench/README.md, "eldr calibrate end to end"): the
// signatures (L2-normalised floats) deflate to 10.9 MB without shuffle at level 1 but only to 15.3 MB with
// shuffle at level 4 (the old storage) in 2.4x the CPU time; the decode profiles (sparse fractions) take shuffle
// + level 1: 5.3 MB vs 5.0 MB at level 4, in half the CPU time.
struct DatasetStorage {
  bool shuffle = true;
  int deflate_level = 1;
};
struct CalibrationStorage {
  DatasetStorage signatures{false, 1};  // /calibration/signatures
  DatasetStorage profiles{true, 1};     // /calibration/decode_profiles and /clusters/expert_load
  int num_threads = 0;
};

// Reads and validates the whole file (shapes, finite values, assignment range). Errors name the file. The large
// datasets are inflated on DefaultThreads() threads (h5::File::ReadParallel).
Result<Calibration> ReadCalibration(const std::string& path);
// Writes through a temporary file renamed into place (the output policy of runtime/common/atomic_file.h).
Status WriteCalibration(const Calibration& calib, const std::string& path, const CalibrationStorage& storage = {});
// Writes to out.temp_path() only, errors naming out.path(); the caller commits (e.g. with the report of the same
// run, through an OutputSet).
Status WriteCalibration(const Calibration& calib, const AtomicOutput& out, const CalibrationStorage& storage = {});
// Checks internal consistency; `name` prefixes errors.
Status ValidateCalibration(const Calibration& calib, const std::string& name);

// The per-cluster mean of `decode_lens` [K] (0 for an empty cluster); empty when decode_lens is.
std::vector<double> ClusterMeanDecodeLen(const std::vector<int64_t>& decode_lens,
                                         const std::vector<int32_t>& assignment, int num_clusters);

// The per-cluster expert load [K, L, E]: mean of the members' decode profiles.
std::vector<float> ClusterExpertLoad(const std::vector<float>& decode_profiles, const std::vector<int32_t>& assignment,
                                     int num_clusters, size_t row_size);

}  // namespace eldr
