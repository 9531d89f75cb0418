// The centroid distances of a signature, d_k = 1 − fl(s·μ_k) (DESIGN.md §3), computed only as far as a decision
// needs them: the exact value of the float matrix-vector product for a few rows, bounds for the others.
//
// A decision reads few distances exactly: the nearest centroid, the band's edge, ties. The filter keeps the
// centroids quantised to int16 (a per-row scale, |q| <= kQuant) beside the float ones, quantises the signature the
// same way and takes the K integer dot products (exact in int64; half the bytes of the float rows, so K = 40 rows
// of D = 6144 are 491 KB instead of 983 KB). Each gives an interval that provably holds the float product's
// value fl(s·μ_k): the quantisation errors by Cauchy–Schwarz (‖s − s̃‖·‖μ_k‖ + ‖s̃‖·‖μ_k − μ̃_k‖) plus the float
// rounding of the product, γ_m·‖s‖·‖μ_k‖ with m = D/P + 16 roundings per term (P floats per SIMD packet: the
// product accumulates each lane over D/P terms, then reduces the P lanes). A question the interval does not settle
// is answered with the exact row, computed by the same Eigen kernel as the full product (so bit for bit its value;
// router_fast_path_test checks it).
//
// Accessor interface of the routing rules (router.cc): Nearest(), Min(), Value(k), Less(a, b), AtMost(k, x).
// Not thread-safe (owned by one Router).
#pragma once

#include <cstdint>
#include <vector>

namespace eldr {

class DistanceFilter {
 public:
  static constexpr int kQuant = 8191;  // |q| of both sides: a lane sums 15 pairs of products in int32

  DistanceFilter() = default;
  // centroids [K, D] row-major. The filter is off (enabled() false) when it could not reproduce the float product
  // bit for bit or cannot bound it: K < 2, D not a multiple of 16, a non-finite centroid entry.
  DistanceFilter(const std::vector<float>& centroids, int K, int D);
  bool enabled() const { return enabled_; }

  // Bounds for signature s [D] against `centroids` (the same [K, D] floats as the constructor's; both borrowed
  // until the next Prepare). False when the filter steps aside for this signature (a non-finite or all-zero s):
  // the caller takes the full product. REQUIRES: enabled().
  bool Prepare(const float* s, const float* centroids);

  int Nearest();  // argmin_k d_k, tie → lower k
  double Min() { return Value(Nearest()); }
  double Value(int k);             // d_k exactly
  bool Less(int a, int b);         // d_a < d_b
  bool AtMost(int k, double x);    // d_k <= x
  int exact_rows() const { return exact_rows_; }  // rows computed exactly since Prepare (tests, benchmarks)

 private:
  void ComputeExact(int k);  // exact_[k] and a neighbour row's, from Eigen's kernel

  bool enabled_ = false;
  int K_ = 0, D_ = 0;
  std::vector<int16_t> quant_;     // [K, D] round(μ_k / scale_k)
  std::vector<double> scale_;      // [K] max_i |μ_k,i| / kQuant
  std::vector<double> norm_;       // [K] ‖μ_k‖ (rounded up)
  std::vector<double> residual_;   // [K] ‖μ_k − scale_k · q_k‖ (rounded up)
  double gamma_ = 0;               // γ_m of the float product
  std::vector<int16_t> sig_quant_;  // [D] the signature's quantisation
  std::vector<double> lo_, hi_;     // [K] lo_k <= d_k <= hi_k
  std::vector<double> exact_;       // [K] d_k where known_
  std::vector<uint8_t> known_;      // [K]
  const float* s_ = nullptr;
  const float* centroids_ = nullptr;
  int exact_rows_ = 0;
  int nearest_ = -1;  // Nearest() since Prepare; -1 = not yet
};

}  // namespace eldr
