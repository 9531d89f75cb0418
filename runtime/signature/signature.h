// Signatures (DESIGN.md §3): a request's prefill-time expert counts c_r(ℓ,e), weighted per variant
// (count·idf by default), restricted to the layer mask S, concatenated over ℓ ∈ S in ascending layer
// order and L2-normalised. Also the per-request arrays every offline step works from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/status.h"
#include "runtime/trace/trace.h"

namespace eldr {

enum class SignatureVariant { kCount, kCountIdf, kSqrt, kBinary, kGateProb };

const char* SignatureVariantName(SignatureVariant v);  // "count", "count_idf", "sqrt", "binary", "gate_prob"
Result<SignatureVariant> ParseSignatureVariant(const std::string& name);
std::vector<SignatureVariant> AllSignatureVariants();

// Dense per-request arrays for a set of requests of one trace.
struct RequestFeatures {
  int num_requests = 0;
  int num_layers = 0;
  int num_experts = 0;
  std::vector<int32_t> request_index;  // [N] row in Trace::requests
  std::vector<float> prefill_counts;   // [N, L, E] c_r(ℓ,e): prompt tokens whose top-k at ℓ contains e
  std::vector<float> gate_sums;        // [N, L, E] Σ over prompt tokens of the gate weight of e, or empty
  std::vector<float> decode_profile;   // [N, L, E] d_r(ℓ,e): fraction of decode tokens routed to e at ℓ
  std::vector<int64_t> decode_tokens;  // [N]
  size_t row_size() const { return static_cast<size_t>(num_layers) * num_experts; }
};

// REQUIRES: every index is a valid request of `trace`.
RequestFeatures ComputeRequestFeatures(const Trace& trace, const std::vector<int32_t>& request_indices);

// Expert counts of every request of a trace (in Trace::requests order): the exact per-request counts every
// RequestFeatures of the trace is derived from, kept without the token rows. Counts are whole numbers, exact in
// float while a request has at most 2^24 tokens.
struct TraceCounts {
  TraceShape shape;
  std::vector<TraceRequest> requests;  // offsets as in the trace
  std::vector<float> prefill_counts;   // [R, L, E] c_r(ℓ,e): prompt tokens whose top-k at ℓ contains e
  std::vector<float> decode_counts;    // [R, L, E] the same over the decode tokens
  std::vector<float> gate_sums;        // [R, L, E] Σ over prompt tokens of the gate weight of e, or empty
  bool has_weights = false;            // the trace's weights were read (gate_sums filled)
  size_t row_size() const { return static_cast<size_t>(shape.num_layers) * shape.num_experts; }
};

// The counts of a trace in memory (requests counted on threads, each in token order).
TraceCounts CountTrace(const Trace& trace);

// The counts of the trace at `path`, bit-identical to CountTrace(ReadTrace(path, options)) and failing on the same
// files. Without options.weights the ids are streamed (TraceStreamReader) and counted block by block as the chunks
// inflate, on the inflating threads, so the tokens are never held; a request split over blocks is counted per
// block into a worker's row and added under a lock (whole numbers: the order of the additions cannot change a
// bit). With options.weights (gate sums depend on the order of their additions) and for a request over 2^24 tokens
// the trace is read whole and counted by CountTrace. ResourceExhausted when the counts exceed the memory budget.
Result<TraceCounts> ReadTraceCounts(const std::string& path, const TraceReadOptions& options);

// The RequestFeatures of `request_indices` (rows of counts.requests): the same arrays ComputeRequestFeatures
// gives on the trace, bit for bit (the decode profile is the decode counts times 1/decode tokens in float).
RequestFeatures FeaturesFromCounts(const TraceCounts& counts, const std::vector<int32_t>& request_indices);

// IDF over a calibration set: df(ℓ,e) = #requests with c_r(ℓ,e) > 0; w = log((|C|+1)/(df+1)). Returns [L, E].
std::vector<float> ComputeIdf(const std::vector<float>& prefill_counts, int num_requests, int num_layers,
                              int num_experts);

// The weighted, un-normalised feature of one (ℓ,e) entry for a variant:
// count: c; count_idf: c·w; sqrt: sqrt(c); binary: 1[c > 0]; gate_prob: Σ gate weights.
inline float VariantFeature(SignatureVariant v, float count, float gate_sum, float idf);

// Everything needed to turn counts into a signature; stored in calibration.h5 /signature.
struct SignatureParams {
  SignatureVariant variant = SignatureVariant::kCountIdf;
  int num_layers = 0;
  int num_experts = 0;
  std::vector<float> idf;           // [L, E]
  std::vector<uint8_t> layer_mask;  // [L], 1 = layer in S

  int num_selected_layers() const;
  int dim() const { return num_selected_layers() * num_experts; }  // D = |S|·E
};

// s_r for one request. counts, gate_sums: [L, E] (gate_sums may be null unless variant is gate_prob);
// out: [dim()]. A request whose masked features are all zero gets the zero vector.
void ComputeSignature(const SignatureParams& params, const float* counts, const float* gate_sums, float* out);

// Unnormalised per-(ℓ,e) variant features for all requests: [N, L, E]. Fails for gate_prob without weights.
Result<std::vector<float>> VariantFeatures(const RequestFeatures& f, SignatureVariant v, const std::vector<float>& idf);

// ---- inline ----
inline float VariantFeature(SignatureVariant v, float count, float gate_sum, float idf) {
  switch (v) {
    case SignatureVariant::kCount:
      return count;
    case SignatureVariant::kCountIdf:
      return count * idf;
    case SignatureVariant::kSqrt:
      return count > 0 ? __builtin_sqrtf(count) : 0.f;
    case SignatureVariant::kBinary:
      return count > 0 ? 1.f : 0.f;
    case SignatureVariant::kGateProb:
      return gate_sum;
  }
  return 0.f;
}

}  // namespace eldr
