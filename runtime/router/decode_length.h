// The router's prediction of how many decode tokens an in-flight request still has to generate (DESIGN.md §3
// "Predicted decode tokens"): the mean residual length of the calibration requests of its cluster that were longer
// than what it has generated so far.
//
//     Remaining(k, g) = mean over {r ∈ cluster k : L_r > g} of (L_r − g)
//
// where L_r is calibration request r's decode tokens (/calibration/decode_lens, at least 1 each) and g the tokens the
// request has generated so far. When no member of k is longer than g, the same mean over every calibration
// request; when none is, 1. At g = 0 it is the cluster's mean decode length (/clusters/mean_decode_len); an empty
// cluster's is the whole calibration's. g counts output tokens as L_r does: from RouterConfig::tokens_at_routing (1 in
// serve and simulate, whose prefill returns the first of a request's L tokens; 0 in `eldr route`). Unlike max(mean −
// g, 1), it grows again for a request that outlives its cluster's mean, as long outputs do: a request 200 tokens into a
// cluster whose members ran 30, 40 and 300 tokens has 100 left, not 1.
//
// Without decode lengths (calibrations written before them, or no calibration): max(prior − g, 1) with the
// calibration's mean_decode_len as the prior, or 1.
// Cost: Remaining is O(log N) (a binary search over the sorted lengths and a suffix sum).
#pragma once

#include <cstdint>
#include <vector>

namespace eldr {

class DecodeLengthPrior {
 public:
  DecodeLengthPrior() = default;
  // decode_lens [N] and assignment [N] (cluster of each calibration request, in [0, K)), or both empty; `prior`
  // [K] the per-cluster mean (used only when decode_lens is empty; may be empty).
  DecodeLengthPrior(const std::vector<int64_t>& decode_lens, const std::vector<int32_t>& assignment, int num_clusters,
                    const std::vector<double>& prior);

  // Whether the calibration's decode lengths are known (Remaining follows the residual rule above).
  bool has_lengths() const { return !all_.sorted.empty(); }
  // The cluster's mean decode length, Remaining(cluster, 0); 1 for cluster −1 or without lengths and prior.
  double Mean(int cluster) const { return Remaining(cluster, 0); }
  // Predicted decode tokens still to come for a request of `cluster` that has generated `generated`: 1 for cluster
  // −1 (a policy without a signature). Always >= 1.
  double Remaining(int cluster, int64_t generated) const;

 private:
  struct Lengths {
    std::vector<int64_t> sorted;  // ascending
    std::vector<double> suffix;   // suffix[i] = Σ sorted[i..]; suffix[n] = 0
  };
  static Lengths Make(std::vector<int64_t> lens);
  static double Residual(const Lengths& l, int64_t g);  // < 0 when no length exceeds g

  std::vector<Lengths> cluster_;  // [K]
  Lengths all_;
  std::vector<double> prior_;  // [K] without lengths
};

}  // namespace eldr
