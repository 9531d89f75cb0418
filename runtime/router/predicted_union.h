// The predicted expert union of each decoder's in-flight requests (DESIGN.md §3 "Marginal-cost routing"), the
// state of the default eldr policy's decisions.
//
// A request r of profile p is modelled as a source of decode tokens each of which activates expert e at MoE layer
// ℓ independently with probability q_p(ℓ,e): the profile is the mean decode profile of the calibration cluster
// nearest to r's signature (/clusters/expert_load, the d_r of DESIGN.md §3 averaged over the members). A decode
// step of decoder k, one token from each of its in-flight requests R_k, then touches in expectation
//
//     U_k = scale · Σ_{ℓ ∈ S, e} (1 − Π_{r ∈ R_k} (1 − q_{p_r}(ℓ,e)))
//
// distinct experts, and one more request of profile p adds
//
//     ΔU_k(p) = scale · Σ_{ℓ ∈ S, e} Π_{r ∈ R_k} (1 − q_{p_r}(ℓ,e)) · q_p(ℓ,e),
//
// where S is the signature's layer mask and scale = L / |S| extrapolates the masked layers to all L (the
// masked layers are the ones whose routing the signature predicts; restricting to them keeps a decision at
// K · |S| · E multiply-adds). q is clamped to [0, 1 − 1e-6] so every factor stays invertible (a removal
// multiplies by the precomputed 1 / (1 − q); an emptied decoder's row is reset to exactly 1).
//
// Cost: Add / Remove O(|S|·E) multiplies, no division or transcendental (one decoder's product row and its union);
// Growth O(|S|·E); Union O(1). Growths(p), what a decision reads, caches ΔU_k(p) per (profile, decoder): a request's
// profile is one of the P cluster profiles, so ΔU_k(p) changes only when decoder k's row does (each Add / Remove
// bumps the decoder's version), and a call recomputes only the decoders changed since the last call for p —
// O(#changed · |S|·E), the same values bit for bit as Growth (the same dot product on the same rows).
// Not thread-safe (owned by one Router).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/common/huge_pages.h"

namespace eldr {

class PredictedUnion {
 public:
  PredictedUnion() = default;
  // profiles [P, L, E] (per-token activation probabilities), layer_mask [L] (non-zero = in S; at least one),
  // `num_decoders` K.
  PredictedUnion(const std::vector<float>& profiles, int num_profiles, const std::vector<uint8_t>& layer_mask,
                 int num_layers, int num_experts, int num_decoders);

  int num_profiles() const { return num_profiles_; }
  // One more in-flight request of `profile` on `decoder` / one fewer. REQUIRES: valid indices; Remove only what
  // was added.
  void Add(int decoder, int profile);
  void Remove(int decoder, int profile);
  // U_k and ΔU_k(p) as above (distinct experts per step over all L layers).
  double Union(int decoder) const { return union_[decoder]; }
  double Growth(int decoder, int profile) const;
  // ΔU_k(profile) for every decoder k ([K]; valid until the next Add, Remove or Growths call), equal bit for bit to
  // Growth(k, profile). REQUIRES: 0 <= profile < num_profiles().
  const double* Growths(int profile);
  int64_t requests(int decoder) const { return count_[decoder]; }
  // Dot products Growths has computed since construction (for tests and benchmarks: K per profile at first, then
  // one per decoder changed since the profile's last call).
  int64_t growth_evaluations() const { return growth_evaluations_; }

 private:
  enum class UpdateKind { kAdd, kRemove, kReset };
  template <UpdateKind kKind>
  void Update(int decoder, int profile);  // keep_exact_, keep_ and union_ of `decoder` in one pass

  int num_profiles_ = 0, row_ = 0;  // row_ = |S| · E
  double scale_ = 1;
  HugePageVector<float> q_;              // [P, row_]
  HugePageVector<double> inverse_keep_;  // [P, row_] 1 / (1 − q_): a removal multiplies by it
  HugePageVector<double> keep_exact_;  // [K, row_] Π_{r ∈ R_k} (1 − q_{p_r}): × (1 − q) in, × 1 / (1 − q) out
  HugePageVector<float> keep_;         // [K, row_] keep_exact_ in float (Growth's dot product)
  std::vector<double> union_;          // [K] U_k
  std::vector<int64_t> count_;         // [K] |R_k|
  std::vector<uint64_t> version_;      // [K] bumped by every Add / Remove of the decoder
  std::vector<double> growth_;         // [P, K] ΔU_k(p) as of growth_version_
  std::vector<uint64_t> growth_version_;  // [P, K] version_[k] when growth_ was computed; kStale = never
  int64_t growth_evaluations_ = 0;
};

}  // namespace eldr
