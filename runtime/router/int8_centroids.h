// The router's centroid dot products in 8 bits (DESIGN.md §3 "Distances"). A decision needs s · μ_k for every
// centroid k (d_k = 1 − s · μ_k); at K = 40 and D = 6144 the float centroids are 983 KB, more than stays in a core's
// L2 next to the signature rows, and the product is bound by the bytes it reads. In int8 they are a quarter of that
// (246 KB) and the product is exact integer arithmetic (AVX-512 VNNI where the CPU has it, plain code otherwise,
// the same integers either way).
//
// Quantisation. Each centroid row k gets a scale a_k = max_i |μ_ki| / 127 and q_ki = round(μ_ki / a_k) in
// [−127, 127]; the signature (non-negative: count·idf, counts, sqrt, binary and gate_prob signatures all are) gets
// b = max_i s_i / 255 and t_i = round(s_i / b) in [0, 255]. Then
//
//     dot_k = a_k · b · Σ_i t_i q_ki      (the integer sum is exact in int32 for D < 66 000)
//
// and, with |μ_ki − a_k q_ki| ≤ a_k/2 and |s_i − b t_i| ≤ b/2,
//
//     |dot_k − s · μ_k| ≤ a_k · b · (Σ_i t_i + Σ_i |q_ki| + D/2) / 2 =: bound_k
//
// (inflated by 1e-6 relative for the floating-point steps). For a unit signature and unit centroids at D = 6144 the
// bound is ~0.01 and the measured error ~1e-4 (bench/README "Online routing cost"): far below the gaps between
// centroids that decide a route, and the same for every CPU.
//
// Not thread-safe (one signature buffer, owned by one Router).
#pragma once

#include <cstdint>
#include <vector>

namespace eldr {

class Int8Centroids {
 public:
  Int8Centroids() = default;
  // centroids [K, D], finite.
  Int8Centroids(const std::vector<float>& centroids, int num_centroids, int dim);

  // dots[k] = dot_k and, when `bounds` is not null, bounds[k] = bound_k (above), for every k. Returns false and
  // writes nothing when the int8 form cannot take s: an entry of s is negative or not finite, or D ≥ 66 000 (the
  // int32 sums could overflow); the caller then takes the float product.
  bool Dots(const float* s, double* dots, double* bounds);

  int num_centroids() const { return num_centroids_; }
  int dim() const { return dim_; }

 private:
  int num_centroids_ = 0, dim_ = 0, padded_ = 0;  // padded_: dim rounded up to 64 (zero tail)
  std::vector<int8_t> q_;                         // [K, padded_]
  std::vector<double> scale_;                     // [K] a_k
  std::vector<int64_t> abs_sum_;                  // [K] Σ_i |q_ki|
  std::vector<uint8_t> t_;                        // [padded_] the quantised signature (scratch)
};

}  // namespace eldr
