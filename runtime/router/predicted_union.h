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
// divides its factors out; an emptied decoder's row is reset to exactly 1).
//
// Cost: Add / Remove O(|S|·E) multiplies or divides, no transcendental (one decoder's product row and its union);
// Growth O(|S|·E); Union O(1).
// Not thread-safe (owned by one Router).
#pragma once

#include <cstdint>
#include <vector>

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
  int64_t requests(int decoder) const { return count_[decoder]; }

 private:
  void Refresh(int decoder);  // keep_ and union_ of `decoder` from keep_exact_

  int num_profiles_ = 0, row_ = 0;  // row_ = |S| · E
  double scale_ = 1;
  std::vector<float> q_;             // [P, row_]
  std::vector<double> keep_factor_;  // [P, row_] 1 − q (≥ 1e-6)
  std::vector<double> keep_exact_;   // [K, row_] Π_{r ∈ R_k} (1 − q_{p_r}), multiplied in and divided out
  std::vector<float> keep_;          // [K, row_] keep_exact_ in float (Growth's dot product)
  std::vector<double> union_;        // [K] U_k
  std::vector<int64_t> count_;       // [K] |R_k|
};

}  // namespace eldr
