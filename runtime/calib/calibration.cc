#include "runtime/calib/calibration.h"

#include <cmath>
#include <functional>
#include <string>
#include <unordered_set>

#include "runtime/common/atomic_file.h"
#include "runtime/common/hdf5.h"

namespace eldr {

std::vector<double> ClusterMeanDecodeLen(const std::vector<int64_t>& decode_lens,
                                         const std::vector<int32_t>& assignment, int num_clusters) {
  if (decode_lens.empty()) return {};
  std::vector<double> sum(num_clusters, 0.0);
  std::vector<int64_t> n(num_clusters, 0);
  for (size_t i = 0; i < assignment.size() && i < decode_lens.size(); ++i) {
    sum[assignment[i]] += static_cast<double>(decode_lens[i]);
    ++n[assignment[i]];
  }
  for (int k = 0; k < num_clusters; ++k) sum[k] = n[k] > 0 ? sum[k] / static_cast<double>(n[k]) : 0.0;
  return sum;
}

namespace {

// The first layer row (E values) of `rows` whose values do not sum to top_k (within 1e-3 relative), or row -1;
// rows where skip(row) are passed over.
struct LayerSum {
  int64_t row = -1;
  double sum = 0;
};
LayerSum FirstLayerNotSummingTo(const std::vector<float>& rows, int E, int top_k,
                                const std::function<bool(int64_t)>& skip) {
  const int64_t num_rows = E > 0 ? static_cast<int64_t>(rows.size()) / E : 0;
  for (int64_t r = 0; r < num_rows; ++r) {
    if (skip && skip(r)) continue;
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += rows[static_cast<size_t>(r) * E + e];
    if (std::abs(sum - top_k) > 1e-3 * top_k) return {r, sum};
  }
  return {};
}

}  // namespace

std::vector<float> ClusterExpertLoad(const std::vector<float>& decode_profiles, const std::vector<int32_t>& assignment,
                                     int num_clusters, size_t row_size) {
  std::vector<double> sum(static_cast<size_t>(num_clusters) * row_size, 0.0);
  std::vector<int64_t> members(num_clusters, 0);
  for (size_t i = 0; i < assignment.size(); ++i) {
    const int c = assignment[i];
    ++members[c];
    const float* d = decode_profiles.data() + i * row_size;
    double* s = sum.data() + c * row_size;
    for (size_t x = 0; x < row_size; ++x) s[x] += d[x];
  }
  std::vector<float> load(sum.size(), 0.f);
  for (int c = 0; c < num_clusters; ++c) {
    if (members[c] == 0) continue;
    for (size_t x = 0; x < row_size; ++x)
      load[c * row_size + x] = static_cast<float>(sum[c * row_size + x] / members[c]);
  }
  return load;
}

namespace {
template <typename T>
bool AllFinite(const std::vector<T>& v) {
  for (const T& x : v) {
    if (!std::isfinite(static_cast<double>(x))) return false;
  }
  return true;
}
}  // namespace

Status ValidateCalibration(const Calibration& c, const std::string& name) {
  const auto bad = [&](const std::string& m) { return Status::Corrupt(name + ": " + m); };
  const int L = c.shape.num_layers, E = c.shape.num_experts;
  if (L <= 0 || E <= 0 || c.shape.top_k <= 0) return bad("model shape must be positive, got " + c.shape.ToString());
  const size_t row = static_cast<size_t>(L) * E;
  if (c.signature.num_layers != L || c.signature.num_experts != E)
    return bad("/signature shape differs from the root attributes");
  if (c.signature.idf.size() != row) return bad("/signature/idf must be [num_layers, num_experts]");
  if (!AllFinite(c.signature.idf)) return bad("/signature/idf has NaN or infinite values");
  for (float w : c.signature.idf) {
    if (w < 0) return bad("/signature/idf has negative values");
    // log((N + 1)/(df + 1)) <= log(N + 1) < 44 for any N < 2^63; larger weights overflow the signature's norm.
    if (w > kMaxIdf) return bad("/signature/idf has a weight over " + std::to_string(static_cast<int>(kMaxIdf)));
  }
  if (c.signature.layer_mask.size() != static_cast<size_t>(L)) return bad("/signature/layer_mask must be [num_layers]");
  for (uint8_t m : c.signature.layer_mask) {
    if (m > 1) return bad("/signature/layer_mask has a value " + std::to_string(m) + ": each layer's is 0 or 1");
  }
  const int D = c.dim();
  if (D == 0) return bad("/signature/layer_mask selects no layer");
  if (c.layer_order.size() != static_cast<size_t>(L)) return bad("/signature/layer_order must be [num_layers]");
  std::vector<uint8_t> seen_layer(L, 0);
  for (int32_t l : c.layer_order) {
    if (l < 0 || l >= L || seen_layer[l]) return bad("/signature/layer_order must be a permutation of the layers");
    seen_layer[l] = 1;
  }
  {
    // The mask is the first |S| layers of the greedy order (eldr calibrate --layers N takes N of them): the
    // signatures and centroids were built on it.
    int selected = 0;
    for (uint8_t m : c.signature.layer_mask) selected += m != 0;
    for (int i = 0; i < L; ++i) {
      if ((c.signature.layer_mask[c.layer_order[i]] != 0) != (i < selected)) {
        return bad("/signature/layer_mask is not the first " + std::to_string(selected) +
                   " layers of /signature/layer_order");
      }
    }
  }
  if (c.rho_curve.size() != static_cast<size_t>(L)) return bad("/signature/rho_curve must be [num_layers]");
  for (double r : c.rho_curve) {
    // A rank correlation; NaN where it is undefined (every signature alike: a trace whose requests all use every
    // expert of the masked layers).
    if (!std::isnan(r) && !(r >= -1 - 1e-9 && r <= 1 + 1e-9))
      return bad("/signature/rho_curve has a value outside [-1, 1]");
  }
  if (c.n_star < 1 || c.n_star > L) return bad("/signature n_star must be in [1, num_layers]");
  const size_t N = c.request_ids.size();
  if (N == 0) return bad("/calibration holds no signatures");
  if (c.domains.size() != N) return bad("/calibration/domains and request_ids differ in length");
  {
    std::unordered_set<std::string> ids;
    for (const std::string& id : c.request_ids) {
      if (!ids.insert(id).second) return bad("/calibration/request_ids holds '" + id + "' twice");
    }
  }
  if (c.signatures.size() != N * D)
    return bad("/calibration/signatures must be [N, D] with D = |S|*E = " + std::to_string(D));
  if (!AllFinite(c.signatures)) return bad("/calibration/signatures has NaN or infinite values");
  // count · idf over the mask, normalised: non-negative, norm 1 (or 0: no masked expert with idf > 0).
  for (size_t i = 0; i < N; ++i) {
    double n2 = 0;
    for (int x = 0; x < D; ++x) {
      const double v = c.signatures[i * D + x];
      if (v < 0) return bad("/calibration/signatures row " + std::to_string(i) + " has a negative value");
      n2 += v * v;
    }
    if (n2 > 0 && std::abs(std::sqrt(n2) - 1) > 1e-3) {
      return bad("/calibration/signatures row " + std::to_string(i) + " has norm " + std::to_string(std::sqrt(n2)) +
                 ", expected 1 (or 0)");
    }
  }
  if (!c.decode_profiles.empty() && c.decode_profiles.size() != N * row) {
    return bad("/calibration/decode_profiles must be [N, num_layers, num_experts]");
  }
  if (!AllFinite(c.decode_profiles)) return bad("/calibration/decode_profiles has NaN or infinite values");
  for (float v : c.decode_profiles) {
    if (v < 0 || v > 1 + 1e-5f) return bad("/calibration/decode_profiles has values outside [0, 1]");
  }
  // A profile is the fraction of a request's decode tokens routed to each expert: each token picks top_k experts
  // of every layer, so every layer of it sums to top_k (a file whose top_k attribute was edited does not).
  if (const LayerSum bad_sum = FirstLayerNotSummingTo(c.decode_profiles, E, c.shape.top_k, {}); bad_sum.row >= 0) {
    return bad("/calibration/decode_profiles of request '" + c.request_ids[bad_sum.row / L] + "' layer " +
               std::to_string(bad_sum.row % L) + " sums to " + std::to_string(bad_sum.sum) +
               ", not top_k = " + std::to_string(c.shape.top_k));
  }
  const int K = c.num_clusters;
  if (K < 1 || static_cast<size_t>(K) > N) return bad("/clusters K must be in [1, N]");
  if (c.centroids.size() != static_cast<size_t>(K) * D) return bad("/clusters/centroids must be [K, D]");
  if (!AllFinite(c.centroids)) return bad("/clusters/centroids has NaN or infinite values");
  if (c.assignment.size() != N) return bad("/clusters/assignment must be [N]");
  std::vector<int64_t> sizes(K, 0);
  for (int32_t a : c.assignment) {
    if (a < 0 || a >= K) return bad("/clusters/assignment has a cluster id outside [0, K)");
    ++sizes[a];
  }
  if (c.sizes != sizes) return bad("/clusters/sizes does not match the assignment");
  // A centroid is the renormalised mean of its members' unit signatures: norm 1, or 0 where every member's
  // signature is 0 (every expert of the masked layers has idf 0: a tiny trace where each request uses them all).
  const auto squared_norm = [D](const std::vector<float>& rows, size_t i) {
    double n2 = 0;
    for (int x = 0; x < D; ++x) n2 += static_cast<double>(rows[i * D + x]) * rows[i * D + x];
    return n2;
  };
  std::vector<uint8_t> has_signature(K, 0);  // a member with a non-zero signature
  for (size_t i = 0; i < N; ++i) {
    if (squared_norm(c.signatures, i) > 0) has_signature[c.assignment[i]] = 1;
  }
  for (int k = 0; k < K; ++k) {
    const double n2 = squared_norm(c.centroids, k);
    if (n2 > 0 && std::abs(std::sqrt(n2) - 1) > 1e-3) {
      return bad("/clusters/centroids row " + std::to_string(k) + " has norm " + std::to_string(std::sqrt(n2)) +
                 ", expected 1 (or 0)");
    }
    if (n2 == 0 && has_signature[k]) {
      return bad("/clusters/centroids row " + std::to_string(k) +
                 " is 0, but members of the cluster have non-zero signatures (expected norm 1)");
    }
  }
  if (c.expert_load.size() != static_cast<size_t>(K) * row) return bad("/clusters/expert_load must be [K, L, E]");
  if (!AllFinite(c.expert_load)) return bad("/clusters/expert_load has NaN or infinite values");
  // Per-token activation probabilities (the router's 1 - q goes negative above 1); 1e-5: float rounding of a mean.
  for (float v : c.expert_load) {
    if (v < 0 || v > 1 + 1e-5f) return bad("/clusters/expert_load has values outside [0, 1]");
  }
  if (!c.decode_lens.empty()) {
    if (c.decode_lens.size() != static_cast<size_t>(N)) return bad("/calibration/decode_lens must be [N]");
    for (int64_t v : c.decode_lens) {
      if (v < 0) return bad("/calibration/decode_lens has a negative length");
      // Far above any request, and Σ over N requests stays far inside the work balance's int64 flow.
      if (v > kMaxDecodeLen) {
        return bad("/calibration/decode_lens has a length of " + std::to_string(v) + " tokens, over " +
                   std::to_string(kMaxDecodeLen));
      }
    }
  }
  if (c.balance == ClusterBalance::kWork && c.decode_lens.empty()) {
    return bad("/clusters is work-balanced but /calibration/decode_lens is missing");
  }
  if (!c.mean_decode_len.empty()) {
    if (c.mean_decode_len.size() != static_cast<size_t>(K)) return bad("/clusters/mean_decode_len must be [K]");
    for (double v : c.mean_decode_len) {
      if (!std::isfinite(v) || v < 0 || v > static_cast<double>(kMaxDecodeLen)) {
        return bad("/clusters/mean_decode_len must be in [0, " + std::to_string(kMaxDecodeLen) + "]");
      }
    }
  }
  // The cluster means are their members' (eldr prices in them): recomputed where the members' data is stored.
  if (!c.decode_profiles.empty()) {
    const std::vector<float> load = ClusterExpertLoad(c.decode_profiles, c.assignment, K, row);
    for (size_t x = 0; x < load.size(); ++x) {
      if (std::abs(load[x] - c.expert_load[x]) > 1e-4f) {
        return bad("/clusters/expert_load is not the mean of its members' /calibration/decode_profiles (cluster " +
                   std::to_string(x / row) + ")");
      }
    }
  } else {
    // A cluster's load is the mean of its members' profiles (an empty cluster's is all 0).
    const auto empty = [&](int64_t r) { return sizes[static_cast<size_t>(r / L)] == 0; };
    if (const LayerSum bad_sum = FirstLayerNotSummingTo(c.expert_load, E, c.shape.top_k, empty); bad_sum.row >= 0) {
      return bad("/clusters/expert_load cluster " + std::to_string(bad_sum.row / L) + " layer " +
                 std::to_string(bad_sum.row % L) + " sums to " + std::to_string(bad_sum.sum) +
                 ", not top_k = " + std::to_string(c.shape.top_k));
    }
  }
  if (!c.decode_lens.empty()) {
    if (c.mean_decode_len.empty())
      return bad("/calibration/decode_lens is stored but /clusters/mean_decode_len is not");
    const std::vector<double> mean = ClusterMeanDecodeLen(c.decode_lens, c.assignment, K);
    for (int k = 0; k < K; ++k) {
      if (std::abs(mean[k] - c.mean_decode_len[k]) > 1e-6 * std::max(1.0, mean[k])) {
        return bad("/clusters/mean_decode_len[" + std::to_string(k) + "] = " + std::to_string(c.mean_decode_len[k]) +
                   " is not the mean of its members' /calibration/decode_lens (" + std::to_string(mean[k]) + ")");
      }
    }
  }
  if (!(c.tau >= 0) || !std::isfinite(c.tau)) return bad("/clusters tau must be a finite value >= 0");
  return Status::Ok();
}

Status WriteCalibration(const Calibration& c, const std::string& path, const CalibrationStorage& storage) {
  AtomicOutput out(path);
  ELDR_RETURN_IF_ERROR(out.CheckWritable());
  ELDR_RETURN_IF_ERROR(WriteCalibration(c, out, storage));
  return out.Commit();
}

Status WriteCalibration(const Calibration& c, const AtomicOutput& out, const CalibrationStorage& storage) {
  const std::string& path = out.path();
  ELDR_RETURN_IF_ERROR(ValidateCalibration(c, path));
  for (const DatasetStorage* d : {&storage.signatures, &storage.profiles}) {
    if (d->deflate_level < 1 || d->deflate_level > 9) {
      return Status::InvalidArgument(path + ": calibration deflate level must be in [1, 9], got " +
                                     std::to_string(d->deflate_level));
    }
  }
  const h5::Filters signature_filters{storage.signatures.shuffle, storage.signatures.deflate_level};
  const h5::Filters profile_filters{storage.profiles.shuffle, storage.profiles.deflate_level};
  {
    ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::Create(out.temp_path(), path));
    const hsize_t L = c.shape.num_layers, E = c.shape.num_experts, N = c.request_ids.size(), D = c.dim(),
                  K = c.num_clusters;
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "format", std::string(kCalibrationFormat)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "format_version", kCalibrationFormatVersion));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "model", c.shape.model));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "num_layers", static_cast<int64_t>(L)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "num_experts", static_cast<int64_t>(E)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "top_k", static_cast<int64_t>(c.shape.top_k)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/", "created", c.created));

    ELDR_RETURN_IF_ERROR(f.Write("/signature/idf", c.signature.idf, {L, E}));
    ELDR_RETURN_IF_ERROR(f.Write("/signature/layer_mask", c.signature.layer_mask, {L}));
    ELDR_RETURN_IF_ERROR(f.Write("/signature/layer_order", c.layer_order, {c.layer_order.size()}));
    ELDR_RETURN_IF_ERROR(f.Write("/signature/rho_curve", c.rho_curve, {c.rho_curve.size()}));
    ELDR_RETURN_IF_ERROR(
        f.WriteAttribute("/signature", "variant", std::string(SignatureVariantName(c.signature.variant))));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/signature", "n_star", static_cast<int64_t>(c.n_star)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/signature", "features", std::string(SignatureFeaturesName(c.features))));

    ELDR_RETURN_IF_ERROR(
        f.Write("/calibration/signatures", c.signatures, {N, D}, signature_filters, storage.num_threads));
    ELDR_RETURN_IF_ERROR(f.WriteStrings("/calibration/request_ids", c.request_ids));
    ELDR_RETURN_IF_ERROR(f.WriteStrings("/calibration/domains", c.domains));
    if (!c.decode_profiles.empty()) {
      ELDR_RETURN_IF_ERROR(
          f.Write("/calibration/decode_profiles", c.decode_profiles, {N, L, E}, profile_filters, storage.num_threads));
    }

    ELDR_RETURN_IF_ERROR(f.Write("/clusters/centroids", c.centroids, {K, D}));
    ELDR_RETURN_IF_ERROR(f.Write("/clusters/assignment", c.assignment, {N}));
    ELDR_RETURN_IF_ERROR(f.Write("/clusters/sizes", c.sizes, {K}));
    ELDR_RETURN_IF_ERROR(
        f.Write("/clusters/expert_load", c.expert_load, {K, L, E}, profile_filters, storage.num_threads));
    if (!c.decode_lens.empty()) {
      ELDR_RETURN_IF_ERROR(f.Write("/calibration/decode_lens", c.decode_lens, {N}));
      ELDR_RETURN_IF_ERROR(f.Write("/clusters/mean_decode_len", c.mean_decode_len, {K}));
      ELDR_RETURN_IF_ERROR(f.WriteAttribute("/clusters", "work_balanced",
                                            static_cast<int64_t>(c.balance == ClusterBalance::kWork ? 1 : 0)));
    }
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/clusters", "K", static_cast<int64_t>(K)));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/clusters", "tau", c.tau));
    ELDR_RETURN_IF_ERROR(f.WriteAttribute("/clusters", "seed", static_cast<int64_t>(c.seed)));
    ELDR_RETURN_IF_ERROR(
        f.WriteAttribute("/clusters", "balanced", static_cast<int64_t>(c.balance == ClusterBalance::kNone ? 0 : 1)));
    ELDR_RETURN_IF_ERROR(f.Close());
  }
  return Status::Ok();
}

const char* SignatureFeaturesName(SignatureFeatures f) {
  return f == SignatureFeatures::kDecode ? "decode" : "prefill";
}

Result<SignatureFeatures> ParseSignatureFeatures(const std::string& name) {
  if (name == "prefill") return SignatureFeatures::kPrefill;
  if (name == "decode") return SignatureFeatures::kDecode;
  return Status::InvalidArgument("signature features '" + name + "' must be prefill or decode");
}

const char* ClusterBalanceName(ClusterBalance b) {
  switch (b) {
    case ClusterBalance::kNone:
      return "none";
    case ClusterBalance::kCount:
      return "count";
    case ClusterBalance::kWork:
      return "work";
  }
  return "unknown";
}

std::string DescribeBalance(ClusterBalance b) {
  switch (b) {
    case ClusterBalance::kNone:
      return "unbalanced (plain spherical k-means)";
    case ClusterBalance::kCount:
      return "balanced by request count";
    case ClusterBalance::kWork:
      return "balanced by decode work";
  }
  return "unknown";
}

Result<ClusterBalance> ParseClusterBalance(const std::string& name) {
  for (ClusterBalance b : {ClusterBalance::kWork, ClusterBalance::kCount, ClusterBalance::kNone}) {
    if (name == ClusterBalanceName(b)) return b;
  }
  return Status::InvalidArgument("cluster balance '" + name + "' must be work, count or none");
}

Result<Calibration> ReadCalibration(const std::string& path) {
  ELDR_ASSIGN_OR_RETURN(h5::File f, h5::File::OpenReadOnly(path));
  Calibration c;
  std::string fmt;
  if (f.HasAttribute("/", "format")) {
    ELDR_ASSIGN_OR_RETURN(fmt, f.ReadStringAttribute("/", "format"));
  }
  if (fmt != kCalibrationFormat) {
    return Status::InvalidArgument(path + ": not a calibration file (root attribute format != '" +
                                   std::string(kCalibrationFormat) + "'); create one with 'eldr calibrate'");
  }
  ELDR_ASSIGN_OR_RETURN(int64_t version, f.ReadIntAttribute("/", "format_version"));
  if (version != kCalibrationFormatVersion) {
    return Status::InvalidArgument(path + ": calibration format_version " + std::to_string(version) +
                                   " is not supported (this eldr reads " + std::to_string(kCalibrationFormatVersion) +
                                   ")");
  }
  ELDR_ASSIGN_OR_RETURN(c.shape.model, f.ReadStringAttribute("/", "model"));
  ELDR_ASSIGN_OR_RETURN(c.created, f.ReadStringAttribute("/", "created"));
  ELDR_ASSIGN_OR_RETURN(int64_t L, f.ReadIntAttribute("/", "num_layers"));
  ELDR_ASSIGN_OR_RETURN(int64_t E, f.ReadIntAttribute("/", "num_experts"));
  ELDR_ASSIGN_OR_RETURN(int64_t top_k, f.ReadIntAttribute("/", "top_k"));
  if (L < 1 || L > 4096 || E < 1 || E > 65535 || top_k < 1 || top_k > E) {
    return Status::Corrupt(path + ": model shape attributes out of range");
  }
  c.shape.num_layers = static_cast<int>(L);
  c.shape.num_experts = static_cast<int>(E);
  c.shape.top_k = static_cast<int>(top_k);

  h5::Dims dims;
  ELDR_ASSIGN_OR_RETURN(std::string variant, f.ReadStringAttribute("/signature", "variant"));
  auto v = ParseSignatureVariant(variant);
  if (!v.ok()) return v.status().WithPrefix(path);
  c.signature.variant = v.value();
  c.signature.num_layers = c.shape.num_layers;
  c.signature.num_experts = c.shape.num_experts;
  ELDR_ASSIGN_OR_RETURN(c.signature.idf, f.Read<float>("/signature/idf", &dims, 2));
  ELDR_ASSIGN_OR_RETURN(c.signature.layer_mask, f.Read<uint8_t>("/signature/layer_mask", &dims, 1));
  ELDR_ASSIGN_OR_RETURN(c.layer_order, f.Read<int32_t>("/signature/layer_order", &dims, 1));
  ELDR_ASSIGN_OR_RETURN(c.rho_curve, f.Read<double>("/signature/rho_curve", &dims, 1));
  ELDR_ASSIGN_OR_RETURN(int64_t n_star, f.ReadIntAttribute("/signature", "n_star"));
  if (n_star < 1 || n_star > L) return Status::Corrupt(path + ": /signature n_star must be in [1, num_layers]");
  c.n_star = static_cast<int>(n_star);
  ELDR_ASSIGN_OR_RETURN(std::string features, f.ReadStringAttribute("/signature", "features"));
  {
    auto parsed = ParseSignatureFeatures(features);
    if (!parsed.ok()) return parsed.status().WithPrefix(path);
    c.features = parsed.value();
  }

  ELDR_ASSIGN_OR_RETURN(c.signatures, f.ReadParallel<float>("/calibration/signatures", &dims, 2));
  ELDR_ASSIGN_OR_RETURN(c.request_ids, f.ReadStrings("/calibration/request_ids"));
  ELDR_ASSIGN_OR_RETURN(c.domains, f.ReadStrings("/calibration/domains"));
  if (f.Exists("/calibration/decode_profiles")) {
    ELDR_ASSIGN_OR_RETURN(c.decode_profiles, f.ReadParallel<float>("/calibration/decode_profiles", &dims, 3));
  }
  ELDR_ASSIGN_OR_RETURN(c.centroids, f.Read<float>("/clusters/centroids", &dims, 2));
  ELDR_ASSIGN_OR_RETURN(c.assignment, f.Read<int32_t>("/clusters/assignment", &dims, 1));
  ELDR_ASSIGN_OR_RETURN(c.sizes, f.Read<int64_t>("/clusters/sizes", &dims, 1));
  ELDR_ASSIGN_OR_RETURN(c.expert_load, f.ReadParallel<float>("/clusters/expert_load", &dims, 3));
  if (f.Exists("/calibration/decode_lens")) {
    ELDR_ASSIGN_OR_RETURN(c.decode_lens, f.Read<int64_t>("/calibration/decode_lens", &dims, 1));
  }
  if (f.Exists("/clusters/mean_decode_len")) {
    ELDR_ASSIGN_OR_RETURN(c.mean_decode_len, f.Read<double>("/clusters/mean_decode_len", &dims, 1));
  }
  int64_t work_balanced = 0;
  if (!c.decode_lens.empty()) {  // written with the decode lengths (and only then)
    ELDR_ASSIGN_OR_RETURN(work_balanced, f.ReadIntAttribute("/clusters", "work_balanced"));
  } else if (f.HasAttribute("/clusters", "work_balanced")) {
    // The decode lengths were removed from a file written with them: never read back as count-balanced.
    ELDR_ASSIGN_OR_RETURN(int64_t orphan, f.ReadIntAttribute("/clusters", "work_balanced"));
    if (orphan != 0) {
      return Status::Corrupt(path +
                             ": /clusters has work_balanced = 1 but no /calibration/decode_lens; re-run "
                             "eldr calibrate on the trace");
    }
  }
  ELDR_ASSIGN_OR_RETURN(int64_t K, f.ReadIntAttribute("/clusters", "K"));
  if (K < 1 || K > static_cast<int64_t>(c.request_ids.size())) {
    return Status::Corrupt(path + ": /clusters K = " + std::to_string(K) + " must be in [1, N]");
  }
  c.num_clusters = static_cast<int>(K);
  ELDR_ASSIGN_OR_RETURN(c.tau, f.ReadDoubleAttribute("/clusters", "tau"));
  ELDR_ASSIGN_OR_RETURN(int64_t seed, f.ReadIntAttribute("/clusters", "seed"));
  c.seed = static_cast<uint64_t>(seed);
  ELDR_ASSIGN_OR_RETURN(int64_t balanced, f.ReadIntAttribute("/clusters", "balanced"));
  if ((balanced != 0 && balanced != 1) || (work_balanced != 0 && work_balanced != 1)) {
    return Status::Corrupt(path + ": /clusters balanced and work_balanced are flags (0 or 1), got " +
                           std::to_string(balanced) + " and " + std::to_string(work_balanced));
  }
  if (balanced == 0 && work_balanced != 0) {
    return Status::Corrupt(path + ": /clusters has balanced = 0 but work_balanced = 1");
  }
  c.balance = balanced == 0        ? ClusterBalance::kNone
              : work_balanced != 0 ? ClusterBalance::kWork
                                   : ClusterBalance::kCount;
  ELDR_RETURN_IF_ERROR(ValidateCalibration(c, path));
  return c;
}

}  // namespace eldr
