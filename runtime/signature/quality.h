// Signature quality ρ and greedy layer selection (DESIGN.md §3).
//
// ρ = Spearman rank correlation, over request pairs, between the cosine distance of the pair's
// signatures and the cosine distance of their decode profiles (over all layers). Pairs are all pairs
// when there are at most `max_pairs` of them, otherwise a seeded uniform sample of `max_pairs`
// distinct pairs (bench/README.md reports the sampling error against all pairs).
//
// Cosine similarity on a layer subset S decomposes over layers: <x_i,x_j>_S = Σ_{ℓ∈S} <x_i,x_j>_ℓ and
// ‖x_i‖²_S = Σ_{ℓ∈S} ‖x_i‖²_ℓ. The evaluator precomputes the per-layer pair dot products and norms once,
// so each candidate subset costs O(#pairs) plus one rank sort.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/common/status.h"

namespace eldr {

struct RequestPairs {
  std::vector<int32_t> first, second;  // [num_pairs], first < second
  bool all_pairs = true;
  size_t size() const { return first.size(); }
};

// All pairs of [0, n) if n(n-1)/2 <= max_pairs (or max_pairs <= 0), else max_pairs distinct random pairs.
RequestPairs SampleRequestPairs(int n, int64_t max_pairs, uint64_t seed);

// Ranks with ties averaged (1-based), as Spearman's definition requires.
std::vector<double> AverageRanks(const std::vector<double>& values);
// Pearson correlation of the ranks. NaN when either side is constant.
double SpearmanCorrelation(const std::vector<double>& x, const std::vector<double>& y);
// Cosine distance 1 − a·b/(‖a‖‖b‖); 1 when either vector is zero.
double CosineDistance(const float* a, const float* b, size_t n);

struct GreedyLayerSelection {
  std::vector<int32_t> layer_order;  // [L] the layer added at each step
  std::vector<double> rho_curve;     // [L] ρ after adding layer_order[0..i]
  int n_star = 0;                    // prefix length where ρ peaks (first maximum)
  double rho_all_layers = 0;         // ρ with every layer
};

class SignatureQuality {
 public:
  // features: [N, L, E] unnormalised variant features; decode_profile: [N, L, E]. Requests with no
  // decode tokens must be excluded by the caller (their profile is zero).
  SignatureQuality(const std::vector<float>& features, const std::vector<float>& decode_profile, int num_requests,
                   int num_layers, int num_experts, const RequestPairs& pairs);
  // Same, with the decode-distance ranks computed once by DecodeRanks and shared between evaluators of
  // one request set (one per signature variant).
  SignatureQuality(const std::vector<float>& features, std::vector<double> decode_ranks, int num_requests,
                   int num_layers, int num_experts, const RequestPairs& pairs);
  // Ranks (ties averaged) of the decode-profile cosine distances of `pairs`; decode_profile: [N, row_size].
  static std::vector<double> DecodeRanks(const std::vector<float>& decode_profile, size_t row_size,
                                         const RequestPairs& pairs);

  // ρ for the layer subset `mask` ([L], 1 = in S).
  double Rho(const std::vector<uint8_t>& mask) const;
  // Adds, one at a time, the layer that raises ρ most (ties: lower layer index) until all L are in.
  // `on_step` (may be null) is called after each step with the number of layers chosen.
  GreedyLayerSelection SelectLayersGreedy(void (*on_step)(void*, int), void* ctx) const;
  int num_layers() const { return num_layers_; }
  size_t num_pairs() const { return num_pairs_; }

 private:
  double RhoFromSums(const std::vector<double>& dot, const std::vector<double>& norm2) const;

  int num_requests_, num_layers_;
  size_t num_pairs_;
  RequestPairs pairs_;
  std::vector<double> layer_dot_;     // [L, P] per-layer dot product of each pair
  std::vector<double> layer_norm2_;   // [L, N] per-layer squared norm of each request
  std::vector<double> decode_ranks_;  // [P] ranks of decode-profile cosine distances
  double decode_rank_mean_ = 0, decode_rank_ss_ = 0;
};

}  // namespace eldr
